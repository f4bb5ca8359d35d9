# Shared by the bench scripts that compare fhsx against bare bwrap with
# fhsx's own flags. Source it; do not run it.
#
# split_run_argv FHSX DIR: from `FHSX run --print-argv -- /bin/true` run
# in DIR, sets two arrays (with bwrap's path first):
#  - bare: minus what only fhsx adds (the RPC socket's bind, whose socket
#    exists only during a run, the supervisor, the seccomp filter passed
#    on an fd), running /bin/true;
#  - inside: with what goes inside kept. The socket's bind gets an empty
#    file, DIR/.sock, in its place, the filter's fd is dropped, and the
#    supervisor's control fd 3 is left to the caller to open.
# Fails, naming FHSX, if its argv could not be read.
split_run_argv() {
  local fhsx=$1 dir=$2 full a target i=0
  mapfile -t full < <(cd "$dir" && "$fhsx" run --print-argv -- /bin/true)
  : >"$dir/.sock"
  bare=() inside=()
  while (( i < ${#full[@]} )); do
    a=${full[$i]}
    target=${full[$((i + 2))]:-}
    if [[ $a == --seccomp ]]; then
      i=$((i + 2)); continue
    fi
    if [[ $a == --ro-bind && $target == /run/wf.sock ]]; then
      inside+=(--ro-bind "$dir/.sock" /run/wf.sock); i=$((i + 3)); continue
    fi
    inside+=("$a")
    if [[ $a == -- ]]; then
      bare+=(-- /bin/true)
      inside+=("${full[@]:$((i + 1))}"); break
    fi
    if [[ $a == --ro-bind && $target == /run/fhsx/supervisor ]] ||
      [[ $a == --setenv && ${full[$((i + 1))]:-} == WF_RPC_SOCK ]]; then
      inside+=("${full[@]:$((i + 1)):2}"); i=$((i + 3)); continue
    fi
    bare+=("$a"); i=$((i + 1))
  done
  (( ${#bare[@]} > 3 )) || { echo "could not get the argv from $fhsx run --print-argv" >&2; return 1; }
}
