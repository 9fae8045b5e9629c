#!/usr/bin/env bash
# scripts/slurm/train.sbatch end to end under stand-ins for srun (one task on this host, with the
# variables of a Slurm step) and scontrol (records a requeue): Slurm's time-limit warning
# (SIGUSR1) makes train write a checkpoint and exit 138, the script then requeues the job and
# exits 138; the requeued job (same folder, --resume auto) continues from that checkpoint.
# Usage: test_slurm.sh BUILD_DIR. Exit 77 (skipped) without Fashion-MNIST.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || {
  echo "skipped: /usr/share/datasets/fashion-mnist is not installed"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "test_slurm: $*" >&2; exit 1; }

mkdir "$tmp/bin"
cat >"$tmp/bin/srun" <<'EOF'
#!/usr/bin/env bash
# One task of a Slurm step on this host: srun's own options dropped, the program run in its place.
while [[ $# -gt 0 && $1 == -* ]]; do shift; done
export SLURM_PROCID=0 SLURM_STEP_NUM_TASKS=1 SLURM_LOCALID=0 SLURM_STEP_NODELIST=localhost
exec "$@"
EOF
cat >"$tmp/bin/scontrol" <<EOF
#!/usr/bin/env bash
case "\$1" in
  show) echo localhost ;;                              # show hostnames NODELIST
  requeue) echo "requeue \$2" >>"$tmp/requeued" ;;
esac
EOF
chmod +x "$tmp/bin/srun" "$tmp/bin/scontrol"
job() {
  env PATH="$tmp/bin:$PATH" SLURM_JOB_ID=4242 SLURM_JOB_NAME=t SLURM_JOB_NODELIST=localhost \
    RUNS="$tmp/runs" SKA_BUILD="$build" SKA_DEVICE=cpu \
    bash "$src/scripts/slurm/train.sbatch" quickstart --set data.workers=1 \
    --set checkpoint.every_steps=5 "$@"
}
run=$tmp/runs/quickstart-t

job >"$tmp/job1.log" 2>&1 &
pid=$!
for _ in $(seq 1200); do [ -f "$run/checkpoints/pointers.json" ] && break; sleep 0.1; done
[ -f "$run/checkpoints/pointers.json" ] || { cat "$tmp/job1.log"; fail "no checkpoint in 120 s"; }
pkill -USR1 -f -- "apps/train --config quickstart .*--output $run"  # as Slurm signals the tasks
status=0
wait "$pid" || status=$?
[ "$status" = 138 ] || { cat "$tmp/job1.log"; fail "the job ended with $status, not 138"; }
grep -q "stopped by SIGUSR1" "$tmp/job1.log" || { cat "$tmp/job1.log"; fail "no clean stop"; }
[ "$(cat "$tmp/requeued" 2>/dev/null)" = "requeue 4242" ] || fail "the job was not requeued"
step=$(sed -n 's/.*stopped by SIGUSR1 after \([0-9]*\) steps.*/\1/p' "$tmp/job1.log")
[ -n "$step" ] || fail "no step count in the stop line"

# The requeued job: the same folder, resumed where it stopped, on to a few more updates.
job --set "train.max_steps=$((step + 3))" >"$tmp/job2.log" 2>&1 ||
  { cat "$tmp/job2.log"; fail "the requeued job failed"; }
grep -q "resumed from .*step-0*$step at epoch 0, batch $step, step $step" "$tmp/job2.log" ||
  { cat "$tmp/job2.log"; fail "the requeued job did not resume at update $step"; }
grep -q "train: stopped after $((step + 3)) steps" "$tmp/job2.log" ||
  { cat "$tmp/job2.log"; fail "the requeued job did not go on to update $((step + 3))"; }
[ "$(wc -l <"$tmp/requeued")" = 1 ] || fail "a finished job was requeued"
echo "test_slurm: ok"
