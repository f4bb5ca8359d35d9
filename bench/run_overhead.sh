#!/usr/bin/env bash
# Overhead of `fhsx run -- /bin/true` against bwrap with the same flags
# (target <= 1.3). Prints the medians and means of each command
# and their ratios.
#
# The baseline, "same": bwrap with every flag fhsx passes it — its
# namespaces, mounts, the RPC socket's bind and the seccomp filter —
# running /bin/true where fhsx runs its supervisor: the kernel work the
# sandbox itself must do. A stricter one, "bare", leaves out what only
# fhsx adds (the socket's bind and the filter); earlier runs gave the
# ratio against that one, and it is printed too.
#
# A third command splits the gap: bwrap with what fhsx adds inside the
# sandbox (the supervisor as PID 1 with its Landlock rules and its start
# and exit messages, the socket's bind mount, the extra variable) but
# without the fhsx process around it. Only the seccomp filter is left out
# (fhsx hands it over on a memfd and does not print it). So "inside"
# against bare is what the sandbox's content costs, and fhsx against
# "inside" what the fhsx process costs: its start, the probe, the cgroup,
# the socket, the spawn and the exit chain.
#
# A fourth, "wrap", is the cheapest process one can put around that same
# sandbox: a static C program that only posix_spawns the "inside" command
# and waits for it (compiled here with cc). wrap/bare is the floor of any
# design where a process outside the sandbox outlives it (to serve the
# RPC bridge, reap, clean up); fhsx/wrap is what fhsx's own work costs.
#
# With PHASES=1 it then splits each command's time into phases (its
# exec, its fork of bwrap, bwrap's clone of the sandbox, PID 1's exec,
# the exits), from the kernel's process tracepoints over PHASE_RUNS (40)
# more interleaved runs, medians (bench/run_phases.py; needs perf:
# apt-get install linux-perf).
#
# Usage: bench/run_overhead.sh [ITERATIONS]   (default 200)
# Env:   FHSX=path/to/fhsx (default: this tree's, built in release)
command -v bwrap >/dev/null || { echo "bwrap missing: apt-get install bubblewrap" >&2; exit 1; }
command -v cc >/dev/null || { echo "cc missing (for the wrap command): apt-get install gcc libc6-dev" >&2; exit 1; }
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
repo=$PWD
N=${1:-200}
F=$(realpath "$F")
cat >"$WORK/wrap.c" <<'C'
#include <spawn.h>
#include <sys/wait.h>
extern char **environ;
int main(int argc, char **argv) {
  pid_t pid;
  int status;
  if (argc < 2 || posix_spawn(&pid, argv[1], 0, 0, argv + 1, environ) != 0) return 127;
  if (waitpid(pid, &status, 0) < 0) return 127;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}
C
cc -O2 -static-pie -o "$WORK/wrap" "$WORK/wrap.c" || { echo "could not compile the wrap command: apt-get install gcc libc6-dev" >&2; exit 1; }

# The bare and inside commands from fhsx's own argv (bench/run_argv.sh);
# the supervisor's control fd 3 is a pipe nobody writes (fd 9 below,
# handed over as 3 to the commands that run it only).
# shellcheck source=bench/run_argv.sh
. bench/run_argv.sh
split_run_argv "$F" "$WORK" || exit 1
"${bare[@]}" || { echo "the bare bwrap command failed: ${bare[*]}" >&2; exit 1; }
"${same[@]}" 5<"$seccomp_file" || { echo "the bwrap command with fhsx's flags failed: ${same[*]}" >&2; exit 1; }
exec 9> >(cat >/dev/null)
"${inside[@]}" 3>&9 6<"$supervisor_file" 9>&- || { echo "the bwrap command with the supervisor failed (as root? fd 6 is the execute-only supervisor): ${inside[*]}" >&2; exit 1; }

# Interleaved: one run of each, N times, so load drifting on a shared
# machine hits all alike, the order rotating (a sandbox's network
# namespace is freed by the kernel after it exits, and whatever runs next
# pays). Timed with bash's $EPOCHREALTIME (no extra process per sample).
# Reports the median and the mean of each.
cd "$WORK" || exit 1
run_bare() { "${bare[@]}" >/dev/null 9>&-; }
run_same() { "${same[@]}" >/dev/null 5<"$seccomp_file" 9>&-; }
run_inside() { "${inside[@]}" >/dev/null 3>&9 6<"$supervisor_file" 9>&-; }
run_wrap() { "$WORK/wrap" "${inside[@]}" >/dev/null 3>&9 6<"$supervisor_file" 9>&-; }
run_fhsx() { "$F" run --workspace "$WORK" -- /bin/true >/dev/null 9>&-; }
run_wrap || { echo "the wrap command failed" >&2; exit 1; }
for _ in 1 2 3 4 5; do run_bare; run_same; run_inside; run_wrap; run_fhsx; done
order=(same bare inside wrap fhsx)
for which in "${order[@]}"; do : >"$WORK/.$which"; done
for ((k = 0; k < N; k++)); do
  for ((j = 0; j < ${#order[@]}; j++)); do
    which=${order[$(((j + k) % ${#order[@]}))]}
    t0=${EPOCHREALTIME/./}; "run_$which"; t1=${EPOCHREALTIME/./}
    echo $((t1 - t0)) >>"$WORK/.$which"
  done
done
stats() { sort -n "$1" | awk '{a[NR]=$1; s+=$1} END {printf "%.3f %.3f\n", a[int((NR+1)/2)]/1000, s/NR/1000}'; }
read -r same_med same_mean < <(stats "$WORK/.same")
read -r bare_med bare_mean < <(stats "$WORK/.bare")
read -r inside_med inside_mean < <(stats "$WORK/.inside")
read -r wrap_med wrap_mean < <(stats "$WORK/.wrap")
read -r fhsx_med fhsx_mean < <(stats "$WORK/.fhsx")
echo "bwrap, fhsx's flags:   median ${same_med} ms, mean ${same_mean} ms (n=$N; socket bind, seccomp filter)"
echo "bare bwrap:            median ${bare_med} ms, mean ${bare_mean} ms (no socket bind, no filter)"
echo "bwrap + inside:        median ${inside_med} ms, mean ${inside_mean} ms (supervisor, socket bind; no filter)"
echo "wrap + inside:         median ${wrap_med} ms, mean ${wrap_mean} ms (a C posix_spawn-and-wait around it)"
echo "fhsx run -- /bin/true: median ${fhsx_med} ms, mean ${fhsx_mean} ms (n=$N)"
echo "ratio (median):        $(echo "scale=3; $fhsx_med / $same_med" | bc)x of bwrap with fhsx's flags (target <= 1.3x)"
echo "ratio (mean):          $(echo "scale=3; $fhsx_mean / $same_mean" | bc)x"
echo "strict (median):       $(echo "scale=3; $fhsx_med / $bare_med" | bc)x of bare bwrap (mean $(echo "scale=3; $fhsx_mean / $bare_mean" | bc)x)"
echo "split (median):        inside/bare $(echo "scale=2; $inside_med / $bare_med" | bc)x, fhsx/inside $(echo "scale=2; $fhsx_med / $inside_med" | bc)x"
echo "floor (median):        wrap/bare $(echo "scale=2; $wrap_med / $bare_med" | bc)x, fhsx/wrap $(echo "scale=2; $fhsx_med / $wrap_med" | bc)x"

if [[ ${PHASES:-0} == 1 ]]; then
  command -v perf >/dev/null || { echo "PHASES=1 needs perf: apt-get install linux-perf" >&2; exit 1; }
  {
    echo "cd $(printf '%q' "$WORK")"
    echo "echo \$\$ > $(printf '%q' "$WORK/.shell")"
    echo "exec 9> >(cat >/dev/null)"
    echo "for ((k = 0; k < ${PHASE_RUNS:-40}; k++)); do"
    echo "  $(printf '%q ' "${bare[@]}") >/dev/null 9>&-"
    echo "  $(printf '%q ' "$WORK/wrap" "${inside[@]}") >/dev/null 3>&9 6<$(printf '%q' "$supervisor_file") 9>&-"
    echo "  $(printf '%q ' "$F" run --workspace "$WORK" -- /bin/true) >/dev/null 9>&-"
    echo "done"
  } >"$WORK/phases.sh"
  perf record -q -a -o "$WORK/perf.data" \
    -e sched:sched_process_exec,sched:sched_process_fork,sched:sched_process_exit \
    -- bash "$WORK/phases.sh" 2>/dev/null
  perf script -i "$WORK/perf.data" -F comm,pid,tid,time,event,trace >"$WORK/perf.txt" 2>/dev/null
  python3 "$repo/bench/run_phases.py" "$WORK/perf.txt" "$(cat "$WORK/.shell")"
fi
