#!/usr/bin/env bash
# make multihost: graphpipe train across several "hosts" on a bad network, inside this machine.
# Each host is a Linux network namespace with its own eth0 (10.77.0.<i+1>), all joined by veth pairs to
# a bridge in a switch namespace; one rank per host, started with the torchrun/srun-style environment
# (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR = host 0's address, MASTER_PORT), no
# launcher. Cases (docs/runtime.md "Several hosts"; figures in docs/results-history.md, issue 37):
#   equal   2 and 3 hosts: the per-step losses equal `train --single` (1e-5 relative)
#   delay   every host's incoming packets delayed D ms +- J ms: completes, losses equal, the measured trace's
#           receive waits grow, and the slowdown (over the pace through the emulator at 0 ms) is compared
#           with `simulate` given that link latency (DELAY_MS, JITTER_MS; DELAY_PLAN=dp: one stage on
#           both hosts, data parallelism, instead of one stage per host)
#   loss    P% of every host's incoming packets dropped: completes, losses equal
#   cut     one host's link taken down mid-run: every rank exits within --timeout (+ slack) naming
#           the peer it lost; the link back up, --resume from the last checkpoint: the losses of the
#           resumed steps are bit-identical to an uninterrupted run's
#   rdzv    a rank that never arrives, a wrong WORLD_SIZE, a taken MASTER_PORT: one line each, exit
#           1 or 2, within the timeout
# Usage: scripts/multihost.sh [--quick] [CASE...]   (default: all cases; --quick: the ctest version:
#        2 hosts, equal + 3% loss + a rank that never arrives, about 20 s)
# Bad network: `tc qdisc ... netem` where the kernel has sch_netem; otherwise (this project's VMs) an
# NFQUEUE rule and scripts/nfq_netem.py, the same delay/jitter/loss in userspace. Needs root, iproute2,
# iptables (NFQUEUE fallback), python3. Exit 77 (skip) when namespaces cannot be made; 0 pass; 1 fail.
# Every namespace (and every process in it) is removed on exit, failure or Ctrl-C.
set -uo pipefail
GP=$(realpath "${GP:-build/graphpipe}")
HERE=$(cd "$(dirname "$0")" && pwd)
QUICK=0
CASES=()
for a in "$@"; do
  case "$a" in
    --quick) QUICK=1 ;;
    equal|delay|loss|cut|rdzv) CASES+=("$a") ;;
    *) echo "usage: $0 [--quick] [equal|delay|loss|cut|rdzv ...]" >&2; exit 2 ;;
  esac
done
[ ${#CASES[@]} -eq 0 ] && CASES=(equal delay loss cut rdzv)
[ $QUICK = 1 ] && CASES=(quick)

TAG="gp$$"            # unique per run: namespaces gp<pid>sw, gp<pid>h<i>
NS=()                 # namespaces made so far (deleted by cleanup)
T=$(mktemp -d /tmp/multihost.XXXXXX)
FAILS=0
PORT=29500            # each run has its own namespaces, hence its own port space

skip() { echo "multihost: SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
ok() { echo "  ok: $*"; }

cleanup() {
  local n p
  for n in "${NS[@]}"; do
    for p in $(ip netns pids "$n" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  done
  for n in "${NS[@]}"; do ip netns del "$n" 2>/dev/null; done
  NS=()
  [ -n "${MH_KEEP:-}" ] && mkdir -p "$MH_KEEP" && cp -r "$T" "$MH_KEEP/"  # MH_KEEP=DIR: keep every run's files
  rm -rf "$T"
}
trap cleanup EXIT
trap 'echo "multihost: interrupted"; exit 130' INT TERM

[ "$(id -u)" = 0 ] || skip "needs root for network namespaces (run as root, or make multihost under sudo)"
command -v ip >/dev/null || skip "iproute2 (ip) is not installed"
[ -x "$GP" ] || { echo "multihost: $GP not built (make cli)"; exit 1; }
ip netns add "${TAG}probe" 2>/dev/null || skip "cannot create a network namespace (ip netns add failed: no CAP_SYS_ADMIN or no netns support)"
ip netns del "${TAG}probe"

# --- hosts -------------------------------------------------------------------------------------
# hosts N: the switch namespace with bridge br0 and N host namespaces, eth0 = 10.77.0.<i+1>/24.
hosts() {
  local n=$1 i sw="${TAG}sw"
  ip netns add "$sw" && NS+=("$sw") || return 1
  ip -n "$sw" link add br0 type bridge && ip -n "$sw" link set br0 up
  for ((i = 0; i < n; i++)); do
    local h="${TAG}h$i"
    ip netns add "$h" && NS+=("$h") || return 1
    ip link add "${TAG}h$i" type veth peer name "${TAG}s$i" || return 1
    ip link set "${TAG}h$i" netns "$h" && ip link set "${TAG}s$i" netns "$sw" || return 1
    ip -n "$h" link set "${TAG}h$i" name eth0
    ip -n "$h" addr add "10.77.0.$((i + 1))/24" dev eth0
    ip -n "$h" link set eth0 up && ip -n "$h" link set lo up
    # With tc netem the delay is held in the sender, where TCP autocorking holds back each later small
    # write (Gloo's 40-byte notices) until the held packets leave (see impair): off in the hosts.
    ip netns exec "$h" sysctl -qw net.ipv4.tcp_autocorking=0 2>/dev/null
    ip -n "$sw" link set "${TAG}s$i" master br0 && ip -n "$sw" link set "${TAG}s$i" up
  done
}
unhosts() { NFQ_PIDS=(); cleanup; T=$(mktemp -d /tmp/multihost.XXXXXX); }
# netem_counts: stops the userspace emulators (netem: reads the qdisc statistics) and prints what they
# did: packets seen and dropped per host.
netem_counts() {
  local i p
  if [ "$NETEM_KIND" = "tc netem" ]; then
    for i in "${!NS[@]}"; do
      [[ "${NS[$i]}" == *h[0-9] ]] && echo -n "${NS[$i]##*h}: $(ip netns exec "${NS[$i]}" tc -s qdisc show dev eth0 | grep -o 'Sent [0-9]* bytes [0-9]* pkt (dropped [0-9]*' | sed 's/(//'); "
    done
    echo
    return
  fi
  for p in "${NFQ_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${NFQ_PIDS[@]}"; do while kill -0 "$p" 2>/dev/null; do sleep 0.05; done; done
  NFQ_PIDS=()
  cat "$T"/nfq*.out | sed -n 's/^nfq_netem: queue 1\([0-9]\): \([0-9]* packets, [0-9]* dropped\)$/host \1: \2/p' | paste -sd ';' -
}
addr() { echo "10.77.0.$(($1 + 1))"; }

# impair HOST DELAY_MS JITTER_MS LOSS_PCT: host HOST's packets on eth0: outgoing with tc netem (a qdisc),
# incoming with NFQUEUE. Incoming, because a sender that holds its own packets for the delay (netem
# on its egress, or NFQUEUE on OUTPUT) still counts them as its socket's bytes in flight below TCP:
# TCP Small Queues then holds back its later writes until those leave, one delay later, so a message
# written after another costs two delays (measured: the gradient took 41 ms at 20 ms). A real link's
# propagation delay holds nothing in the sender; a packet crossing the veth into the host leaves the
# sender's accounting, so delaying it on arrival is the same link delay without the artefact.
NETEM_KIND=""
NFQ_PIDS=()
impair() {
  local h="${TAG}h$1" d=$2 j=$3 l=$4
  if [ -z "$NETEM_KIND" ]; then
    if ip netns exec "$h" tc qdisc add dev eth0 root netem delay 1ms 2>/dev/null; then
      ip netns exec "$h" tc qdisc del dev eth0 root
      NETEM_KIND="tc netem"
    else
      command -v iptables >/dev/null || { echo "multihost: the kernel has no sch_netem and iptables is missing (scripts/install-deps.sh)"; return 1; }
      NETEM_KIND="NFQUEUE + scripts/nfq_netem.py (this kernel has no sch_netem)"
    fi
    echo "  bad network through: $NETEM_KIND"
  fi
  if [ "$NETEM_KIND" = "tc netem" ]; then
    ip netns exec "$h" tc qdisc replace dev eth0 root netem delay "${d}ms" "${j}ms" loss "${l}%"
  else
    ip netns exec "$h" python3 "$HERE/nfq_netem.py" --queue "$((10 + $1))" --delay "$(awk -v x="$d" 'BEGIN{print x/1000}')" \
      --jitter "$(awk -v x="$j" 'BEGIN{print x/1000}')" --loss "$(awk -v x="$l" 'BEGIN{print x/100}')" \
      --seed "$((7 + $1))" > "$T/nfq$1.out" 2>&1 &
    NFQ_PIDS+=($!); disown $!
    for _ in $(seq 50); do grep -q "^nfq_netem: queue" "$T/nfq$1.out" 2>/dev/null && break; sleep 0.1; done
    ip netns exec "$h" iptables -A INPUT -i eth0 -j NFQUEUE --queue-num "$((10 + $1))" || return 1
  fi
}

# unimpair HOST: the host's link back to clean (the qdisc or the NFQUEUE rule removed, the emulators stopped).
unimpair() {
  local h="${TAG}h$1"
  if [ "$NETEM_KIND" = "tc netem" ]; then ip netns exec "$h" tc qdisc del dev eth0 root; return; fi
  ip netns exec "$h" iptables -D INPUT -i eth0 -j NFQUEUE --queue-num "$((10 + $1))" || return 1
  local p
  for p in "${NFQ_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${NFQ_PIDS[@]}"; do while kill -0 "$p" 2>/dev/null; do sleep 0.05; done; done
  NFQ_PIDS=()
}

# ranks HOSTS ARGS...: start rank i in host i (background), pids in RPIDS; output in $T/r<i>.{out,err}.
# WORLD (default HOSTS) and SKIP_RANK (a rank not to start) adjust the environment.
RPIDS=()
ranks() {
  local n=$1 i; shift
  RPIDS=()
  for ((i = 0; i < n; i++)); do
    [ "${SKIP_RANK:--1}" = "$i" ] && { RPIDS+=(""); continue; }
    ip netns exec "${TAG}h$i" env RANK=$i WORLD_SIZE="${WORLD:-$n}" LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
      MASTER_ADDR="$(addr 0)" MASTER_PORT=$PORT "$GP" train "$@" > "$T/r$i.out" 2> "$T/r$i.err" &
    RPIDS+=($!)
  done
}
# wait_ranks LIMIT_S: waits for every started rank, at most LIMIT_S seconds (then kills them);
# RCODES: exit codes; RSECS: seconds until each exited; returns 1 when a rank had to be killed.
wait_ranks() {
  local limit=$1 t0 i left=1 hung=0
  t0=$(date +%s.%N)
  RCODES=(); RSECS=()
  while [ $left = 1 ]; do
    left=0
    for i in "${!RPIDS[@]}"; do
      local p=${RPIDS[$i]}
      [ -z "$p" ] || [ -n "${RCODES[$i]:-}" ] && continue
      if kill -0 "$p" 2>/dev/null; then left=1; else
        wait "$p"; RCODES[$i]=$?; RSECS[$i]=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
      fi
    done
    if [ $left = 1 ] && awk -v a="$t0" -v b="$(date +%s.%N)" -v l="$limit" 'BEGIN{exit !(b-a > l)}'; then
      for i in "${!RPIDS[@]}"; do
        [ -n "${RPIDS[$i]}" ] && [ -z "${RCODES[$i]:-}" ] && { kill -9 "${RPIDS[$i]}" 2>/dev/null; hung=1; }
      done
    fi
    [ $left = 1 ] && sleep 0.1
  done
  return $hung
}

# compare A.json B.json TOL: the "losses" of two train --json outputs (TOL 0: bit-identical).
compare() {
  python3 - "$@" <<'EOF'
import json, sys
a, b, tol = json.load(open(sys.argv[1]))["losses"], json.load(open(sys.argv[2]))["losses"], float(sys.argv[3])
if len(a) != len(b): sys.exit(f"{len(a)} losses against {len(b)}")
worst = max(abs(x - y) / max(abs(y), 1e-30) for x, y in zip(a, b))
if worst > tol: sys.exit(f"losses differ: worst relative difference {worst:.3g} > {tol:g}")
print(f"{len(a)} losses equal (worst relative difference {worst:.2g}), {a[0]:.4f} -> {a[-1]:.4f}")
EOF
}

MODEL_BASE="layers=1,seq=16,hidden=64,heads=4,ffn=128,classes=10"
model() { echo "mmt:branches=$1,$MODEL_BASE"; }
COMMON=(--seed 5 --optimizer adam --lr 0.001 --threads 1)
# plan_for N: a plan with one stage per host (summit costs partition the branches: one per device,
# the head with the last), and the --single reference of the same model for STEPS steps.
plan_for() {
  local n=$1 steps=$2
  "$GP" plan --model "$(model "$n")" --cluster summit --devices "$n" --batch 16 --out "$T/plan$n.json" > /dev/null || return 1
  "$GP" train --single --model "$(model "$n")" --batch 16 --steps "$steps" "${COMMON[@]}" --json > "$T/single$n.json" || return 1
}

# run_ok N LIMIT LABEL ARGS...: N ranks to completion; rank 0's --json in $T/<label>.json.
run_ok() {
  local n=$1 limit=$2 label=$3 i; shift 3
  ranks "$n" "$@" --json
  if ! wait_ranks "$limit"; then fail "$label: a rank hung past ${limit} s"; tail -n 3 "$T"/r*.err; return 1; fi
  for i in "${!RCODES[@]}"; do
    [ "${RCODES[$i]}" = 0 ] || { fail "$label: rank $i exited ${RCODES[$i]}: $(tail -n 1 "$T/r$i.err")"; return 1; }
  done
  # the JSON object (a resumed run prints "resumed from D after K steps" before it)
  sed -n '/^{/,$p' "$T/r0.out" > "$T/$label.json"
}

case_equal() {
  local n
  for n in 2 3; do
    echo "== equal: $n hosts, 20 steps"
    hosts "$n" || { fail "making $n hosts"; return; }
    plan_for "$n" 20 || { fail "plan"; unhosts; return; }
    local t0; t0=$(date +%s.%N)
    if run_ok "$n" 120 "equal$n" --plan "$T/plan$n.json" --steps 20 "${COMMON[@]}" --timeout 20; then
      local r; r=$(compare "$T/equal$n.json" "$T/single$n.json" 1e-5) && ok "$n hosts vs --single: $r (wall $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s)" || fail "$n hosts vs --single: $r"
    fi
    unhosts
  done
}

# recv_wait TRACE.json: per rank, the seconds the traced (last) step spent in receive actions.
recv_wait() {
  python3 - "$1" <<'EOF'
import json, sys
t = json.load(open(sys.argv[1]))
ev = t["traceEvents"] if isinstance(t, dict) else t
names = {e["pid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "process_name"}
wait = {}
for e in ev:
    if e.get("ph") == "X" and "recv" in (e.get("cat", "") + e.get("name", "")):
        wait[e["pid"]] = wait.get(e["pid"], 0) + e["dur"] / 1e6
print(", ".join(f"{names.get(p, p)} {w * 1e3:.1f} ms" for p, w in sorted(wait.items())))
EOF
}

# sim_cluster PLAN OUT ADD_S: the calibrated cpu preset for PLAN's device count (planned on `cpu`), every
# link's latency + ADD_S seconds: what `simulate` is told about the delayed network.
sim_cluster() {
  local n; n=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['cluster']['num_devices'])" "$1")
  "$GP" plan --model "$(model "$n")" --cluster cpu --devices "$n" --batch 16 --out "$T/cpuplan.json" > /dev/null || return 1
  python3 - "$T/cpuplan.json" "$2" "$3" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))["costs"]["cluster"]
for link in ("intra", "inter"):
    if link in c and c[link]:
        c[link]["latency_s"] += float(sys.argv[3])
json.dump(c, open(sys.argv[2], "w"))
EOF
}
sim_time() { "$GP" simulate --plan "$1" --cluster "$2" --json | python3 -c "import json,sys; print(json.load(sys.stdin)['iteration_time_s'])"; }

# dp_plan PLAN: PLAN rewritten as one stage of every op replicated on both hosts (data parallelism: the
# step's only network traffic is the gradient all-reduce, a Gloo ring).
dp_plan() {
  python3 - "$1" <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))
st = dict(p["stages"][-1])
st.update(id=0, devices=[0, 1], ops=[o for s in p["stages"] for o in s["ops"]], inputs_from=[], outputs_to=[], in_flight=1)
p["stages"] = [st]
json.dump(p, open(sys.argv[1], "w"), indent=1)
EOF
}

case_delay() {
  local d=${DELAY_MS:-20} j=${JITTER_MS:-5} steps=30 kind=${DELAY_PLAN:-pipeline}
  echo "== delay: 2 hosts, every host's incoming packets ${d} ms +- ${j} ms, $steps steps, $kind plan"
  hosts 2 || { fail "making 2 hosts"; return; }
  plan_for 2 $steps || { fail "plan"; unhosts; return; }
  [ "$kind" = dp ] && { dp_plan "$T/plan2.json" || { fail "dp plan"; unhosts; return; }; }
  run_ok 2 120 base --plan "$T/plan2.json" --steps $steps "${COMMON[@]}" --timeout 20 --trace "$T/base.trace.json" || { unhosts; return; }
  # The same network through the emulator at 0 ms: what the emulator itself costs (NFQUEUE hands every
  # packet to a Python process), which is no part of the link's latency.
  impair 0 0 0 0 && impair 1 0 0 0 || { fail "impairing the links"; unhosts; return; }
  run_ok 2 120 base0 --plan "$T/plan2.json" --steps $steps "${COMMON[@]}" --timeout 20 || { unhosts; return; }
  unimpair 0 && unimpair 1 || { fail "restoring the links"; unhosts; return; }
  impair 0 "$d" "$j" 0 && impair 1 "$d" "$j" 0 || { fail "impairing the links"; unhosts; return; }
  run_ok 2 300 delay --plan "$T/plan2.json" --steps $steps "${COMMON[@]}" --timeout 20 --trace "$T/delay.trace.json" || { unhosts; return; }
  local r; r=$(compare "$T/delay.json" "$T/single2.json" 1e-5) && ok "delayed run completes: $r" || fail "delayed losses: $r"
  echo "  receive waits in the traced step: clean network: $(recv_wait "$T/base.trace.json"); delayed: $(recv_wait "$T/delay.trace.json")"
  sim_cluster "$T/plan2.json" "$T/c0.json" 0 && sim_cluster "$T/plan2.json" "$T/cd.json" "$(awk -v x="$d" 'BEGIN{print x/1000}')" || { fail "cluster files"; unhosts; return; }
  local sb sd
  sb=$(sim_time "$T/plan2.json" "$T/c0.json"); sd=$(sim_time "$T/plan2.json" "$T/cd.json")
  # The simulator's iteration time is the pace of training (every stage starts the iteration at 0):
  # compared with the measured step_period_s (one step's end to the next's). The measured
  # iteration_time_s (a step's first start to its last end) also counts the time the last stage spends
  # waiting for its first input, having started its step early: printed, not compared.
  # The slowdown the delay causes is the delayed pace less the pace through the emulator at 0 ms (the
  # simulator is told the delay, not the emulator's cost); the one against the clean network is printed.
  python3 - "$T/base.json" "$T/base0.json" "$T/delay.json" "$sb" "$sd" "$d" <<'EOF'
import json, sys
b, b0, m = (json.load(open(f)) for f in sys.argv[1:4])
sb, sd, d = map(float, sys.argv[4:])
wb, wd = b["iteration_time_s"], m["iteration_time_s"]
mb, m0, md = b["step_period_s"], b0["step_period_s"], m["step_period_s"]
dm, ds = md - m0, sd - sb
err = (ds - dm) / dm if dm > 0 else float("inf")
print(f"  step time (first start to last end), measured: {wb * 1e3:.1f} ms clean, {wd * 1e3:.1f} ms delayed (+{(wd - wb) * 1e3:.1f} ms)")
print(f"  pace (step end to step end), measured: {mb * 1e3:.1f} ms clean, {m0 * 1e3:.1f} ms through the emulator at 0 ms, "
      f"{md * 1e3:.1f} ms delayed (+{dm * 1e3:.1f} ms over the emulator at 0 ms, +{(md - mb) * 1e3:.1f} ms over clean)")
print(f"  iteration time, simulated with link latency + {d:g} ms: {sb * 1e3:.1f} ms, {sd * 1e3:.1f} ms (+{ds * 1e3:.1f} ms, x{sd / sb:.2f})")
print(f"  predicted slowdown (added time per iteration) vs measured: {err * 100:+.1f}% "
      f"(vs the clean network's pace: {((ds - (md - mb)) / (md - mb)) * 100:+.1f}%)")
sys.exit(0 if abs(err) <= 0.2 else 3)
EOF
  # Reported, not a pass/fail check: on this shared 2-core machine the measured pace moves by several
  # ms from run to run, so the error lands on either side of 20% at 20 ms (13-23%, docs/results.md,
  # issue 37) and further at 5 ms. MH_STRICT_PREDICTION=1 makes a miss a failure.
  case $? in
    0) ok "predicted slowdown within 20% of the measured" ;;
    *) if [ "${MH_STRICT_PREDICTION:-0}" = 1 ]; then fail "predicted slowdown off by more than 20% (above)"
       else echo "  NOT MET: the predicted slowdown is off by more than 20% (the goal; reported, not checked)"; fi ;;
  esac
  unhosts
}

case_loss() {
  local l=${LOSS_PCT:-3} n
  for n in 2 3; do
    [ $n = 2 ] && [ "$QUICK" = 0 ] && continue
    echo "== loss: $n hosts, ${l}% of every host's incoming packets dropped, 20 steps"
    hosts "$n" || { fail "making $n hosts"; return; }
    plan_for "$n" 20 || { fail "plan"; unhosts; return; }
    local i; for ((i = 0; i < n; i++)); do impair $i 0 0 "$l" || { fail "impairing the links"; unhosts; return; }; done
    local t0; t0=$(date +%s.%N)
    if run_ok "$n" 300 "loss$n" --plan "$T/plan$n.json" --steps 20 "${COMMON[@]}" --timeout 30; then
      local r; r=$(compare "$T/loss$n.json" "$T/single$n.json" 1e-5) && ok "completes with ${l}% loss: $r (wall $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s)" || fail "losses with ${l}% loss: $r"
    fi
    echo "  packets: $(netem_counts)"
    unhosts
  done
}

# The cut: 3 hosts, a checkpoint every 5 steps; host 2's link goes down once rank 0 logged CUT_AT
# steps. Every rank must exit 1 within --timeout + CUT_SLACK s of the cut, naming a peer; with the
# link back up, --resume finishes the run and its losses must be bit-identical to an uninterrupted run.
case_cut() {
  local n=3 steps=60 cut_at=${CUT_AT:-20} to=${CUT_TIMEOUT:-5} slack=10 i
  echo "== cut: $n hosts, $steps steps, checkpoint every 5, host 2's link down after step $cut_at, --timeout $to"
  hosts $n || { fail "making $n hosts"; return; }
  plan_for $n $steps || { fail "plan"; unhosts; return; }
  local args=(--plan "$T/plan$n.json" --steps $steps "${COMMON[@]}" --timeout "$to")
  run_ok $n 180 uncut "${args[@]}" || { unhosts; return; }
  ranks $n "${args[@]}" --checkpoint-dir "$T/ck" --checkpoint-every 5 --log "$T/cut.jsonl"
  local t_cut=""
  for _ in $(seq 600); do
    if [ "$( { wc -l < "$T/cut.jsonl"; } 2>/dev/null || echo 0)" -ge "$cut_at" ]; then
      ip -n "${TAG}h2" link set eth0 down; t_cut=$(date +%s.%N); break
    fi
    kill -0 "${RPIDS[0]}" 2>/dev/null || break
    sleep 0.05
  done
  [ -n "$t_cut" ] || { fail "cut: the run ended before step $cut_at"; wait_ranks 5; unhosts; return; }
  wait_ranks $((to + slack + 20))
  local t_end bad=0 logged; t_end=$(date +%s.%N)
  logged=$(wc -l < "$T/cut.jsonl")
  echo "  cut after $logged logged steps; every rank's last line:"
  for i in "${!RPIDS[@]}"; do
    echo "    rank $i: exit ${RCODES[$i]} after ${RSECS[$i]} s: $(tail -n 1 "$T/r$i.err")"
    [ "${RCODES[$i]}" = 1 ] || { fail "cut: rank $i exited ${RCODES[$i]} (want 1)"; bad=1; }
    tail -n 1 "$T/r$i.err" | grep -Eq "rank [0-9]" || { fail "cut: rank $i does not name a peer"; bad=1; }
  done
  local since; since=$(awk -v a="$t_cut" -v b="$t_end" 'BEGIN{printf "%.1f", b-a}')
  awk -v s="$since" -v l="$((to + slack))" 'BEGIN{exit !(s <= l)}' && ok "every rank stopped ${since} s after the cut (--timeout $to)" || { fail "cut: ranks took ${since} s to stop (limit $((to + slack)) s)"; bad=1; }
  echo "  checkpoints: $(ls "$T/ck" | tr '\n' ' ')"
  ip -n "${TAG}h2" link set eth0 up
  run_ok $n 180 resumed "${args[@]}" --checkpoint-dir "$T/ck" --resume || { unhosts; return; }
  echo "  resumed: $(grep -o 'after [0-9]* steps' "$T/r0.err" "$T/r0.out" 2>/dev/null | sed -n 1p | sed 's/.*://')"
  python3 - "$T/resumed.json" "$T/uncut.json" <<'EOF'
import json, sys
r, u = json.load(open(sys.argv[1]))["losses"], json.load(open(sys.argv[2]))["losses"]
tail = u[len(u) - len(r):]
if not r or r != tail:
    sys.exit(f"resumed losses ({len(r)}) differ from the uninterrupted run's last {len(r)}")
print(f"the {len(r)} resumed steps' losses are bit-identical to the uninterrupted run's (last {r[-1]:.6f})")
EOF
  [ $? = 0 ] && ok "resume after the cut" || fail "resume after the cut"
  unhosts
}

# expect_fault LABEL LIMIT: every started rank exited non-zero within LIMIT s, with 1 or 2, and one
# line on stderr; prints each rank's line.
expect_fault() {
  local label=$1 limit=$2 i bad=0
  wait_ranks "$limit" || { fail "$label: a rank hung past $limit s"; bad=1; }
  for i in "${!RPIDS[@]}"; do
    [ -z "${RPIDS[$i]}" ] && continue
    local code=${RCODES[$i]} lines
    lines=$(grep -cv '^$' "$T/r$i.err")
    echo "    rank $i: exit $code after ${RSECS[$i]} s: $(tail -n 1 "$T/r$i.err")"
    case "$code" in 1|2) ;; *) fail "$label: rank $i exited $code (want 1 or 2)"; bad=1 ;; esac
    [ "$lines" = 1 ] || { fail "$label: rank $i printed $lines lines on stderr (want 1)"; sed 's/^/      /' "$T/r$i.err" | head -n 20; bad=1; }
  done
  [ $bad = 0 ] && ok "$label"
}

# The three rendezvous faults on 2 hosts with --timeout RDZV_TIMEOUT.
RDZV_TIMEOUT=5
rdzv_missing() {
  echo "== rendezvous: rank 1 never arrives (--timeout $RDZV_TIMEOUT)"
  SKIP_RANK=1 ranks 2 --plan "$T/plan2.json" --steps 3 "${COMMON[@]}" --timeout $RDZV_TIMEOUT
  expect_fault "a rank that never arrives" $((RDZV_TIMEOUT + 10))
}
rdzv_world() {
  echo "== rendezvous: WORLD_SIZE=3 for a 2-device plan, on every rank"
  WORLD=3 ranks 2 --plan "$T/plan2.json" --steps 3 "${COMMON[@]}" --timeout $RDZV_TIMEOUT
  expect_fault "a wrong WORLD_SIZE" $((RDZV_TIMEOUT + 10))
}
rdzv_port() {
  echo "== rendezvous: MASTER_PORT taken on host 0 by a process that is not a store"
  ip netns exec "${TAG}h0" python3 -c "
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('0.0.0.0', $PORT)); s.listen()
print('listening', flush=True); time.sleep(120)" > "$T/squatter.out" 2>&1 &
  local squatter=$!
  for _ in $(seq 50); do grep -q listening "$T/squatter.out" 2>/dev/null && break; sleep 0.1; done
  ranks 2 --plan "$T/plan2.json" --steps 3 "${COMMON[@]}" --timeout $RDZV_TIMEOUT
  expect_fault "a taken MASTER_PORT" $((RDZV_TIMEOUT + 10))
  { kill "$squatter"; wait "$squatter"; } 2>/dev/null
}
case_rdzv() {
  hosts 2 || { fail "making 2 hosts"; return; }
  plan_for 2 3 || { fail "plan"; unhosts; return; }
  rdzv_missing; rdzv_world; rdzv_port
  unhosts
}

# The ctest version (multihost_quick): 2 hosts, the losses equal --single on a clean and on a lossy
# network (3% dropped), and a rank that never arrives; about 20 s.
case_quick() {
  echo "== quick: 2 hosts, 10 steps clean and with 3% loss; a rank that never arrives"
  hosts 2 || { fail "making 2 hosts"; return; }
  plan_for 2 10 || { fail "plan"; unhosts; return; }
  local r
  if run_ok 2 60 clean --plan "$T/plan2.json" --steps 10 "${COMMON[@]}" --timeout 20; then
    r=$(compare "$T/clean.json" "$T/single2.json" 1e-5) && ok "2 hosts vs --single: $r" || fail "2 hosts vs --single: $r"
  fi
  impair 0 0 0 3 && impair 1 0 0 3 || { fail "impairing the links"; unhosts; return; }
  if run_ok 2 60 lossy --plan "$T/plan2.json" --steps 10 "${COMMON[@]}" --timeout 20; then
    r=$(compare "$T/lossy.json" "$T/single2.json" 1e-5) && ok "3% loss: $r" || fail "3% loss: $r"
  fi
  echo "  packets: $(netem_counts)"
  RDZV_TIMEOUT=3 rdzv_missing
  unhosts
}

main() {
  echo "multihost: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores, $GP"
  local c
  for c in "${CASES[@]}"; do "case_$c"; done
  if [ $FAILS -gt 0 ]; then echo "multihost: $FAILS failure(s)"; exit 1; fi
  echo "multihost passed"
}
main
