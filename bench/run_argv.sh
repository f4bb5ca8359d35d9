# Shared by the bench scripts that compare fhsx against bare bwrap with
# fhsx's own flags. Source it; do not run it.
#
# split_run_argv FHSX DIR: from `FHSX run --print-argv -- /bin/true` run
# in DIR, sets three arrays (with bwrap's path first) and two paths:
#  - same: fhsx's own flags, every one of them, running /bin/true in
#    place of the supervisor: the seccomp filter on fd 5 (from the file
#    $seccomp_file, which the caller opens as `5<`), the RPC socket's
#    bind (an empty file, DIR/.sock, in its place: the socket exists only
#    during a run). "bare bwrap with the same flags", the baseline of
#    fhsx run's overhead target;
#  - bare: minus what only fhsx adds — the RPC socket's bind, the seccomp
#    filter — running /bin/true: the stricter floor measured before;
#  - inside: bare plus what goes inside (the socket's bind, the
#    supervisor as PID 1), but no filter. bwrap execs the supervisor from
#    fd 6 (`/proc/self/fd/6`): the caller opens $supervisor_file there
#    (`6<`, which takes root: the file is execute-only), and the
#    supervisor's control fd 3.
# Fails, naming FHSX, if its argv could not be read.
split_run_argv() {
  local fhsx=$1 dir=$2 full a target i=0
  seccomp_file=$dir/.seccomp
  mapfile -t full < <(cd "$dir" && "$fhsx" run --print-argv --save-seccomp "$seccomp_file" -- /bin/true)
  # shellcheck disable=SC2012  # the newest by mtime; names are ours
  supervisor_file=$(ls -t "${TMPDIR:-/tmp}/fhsx-$(id -u)"/supervisor-* 2>/dev/null | head -1)
  : >"$dir/.sock"
  bare=() inside=() same=()
  while (( i < ${#full[@]} )); do
    a=${full[$i]}
    target=${full[$((i + 2))]:-}
    if [[ $a == --seccomp ]]; then
      same+=("${full[@]:$i:2}"); i=$((i + 2)); continue
    fi
    if [[ $a == --ro-bind && $target == /run/wf.sock ]]; then
      inside+=(--ro-bind "$dir/.sock" /run/wf.sock)
      same+=(--ro-bind "$dir/.sock" /run/wf.sock); i=$((i + 3)); continue
    fi
    inside+=("$a")
    if [[ $a == -- ]]; then
      bare+=(-- /bin/true)
      same+=(-- /bin/true)
      inside+=("${full[@]:$((i + 1))}"); break
    fi
    if [[ $a == --setenv && ${full[$((i + 1))]:-} == WF_RPC_SOCK ]]; then
      inside+=("${full[@]:$((i + 1)):2}")
      same+=("${full[@]:$i:3}"); i=$((i + 3)); continue
    fi
    bare+=("$a"); same+=("$a"); i=$((i + 1))
  done
  (( ${#bare[@]} > 3 )) || { echo "could not get the argv from $fhsx run --print-argv" >&2; return 1; }
  [[ -s $seccomp_file ]] || { echo "$fhsx run --save-seccomp wrote no filter" >&2; return 1; }
  [[ -n $supervisor_file ]] || { echo "no installed supervisor under ${TMPDIR:-/tmp}/fhsx-$(id -u)" >&2; return 1; }
}
