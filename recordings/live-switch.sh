#!/usr/bin/env bash
# Records recordings/live-switch.db: a tiny 2-rank job switched live with `ddptop ctl` from a second shell.
set -euo pipefail
PORT=29617
D=.venv/bin/ddptop
$D --headless --local 2 --model tiny --steps 1500 --synthetic-size 640 --batch-size 16 --no-eval --span-every 5 \
   --port $PORT --record recordings/live-switch.db &
JOB=$!
sleep 8
$D ctl --port $PORT set strategy=allreduce async_op=true
sleep 3
$D ctl --port $PORT set strategy=ddp bucket_mb=0.05
sleep 3
$D ctl --port $PORT pause
sleep 2
$D ctl --port $PORT resume
sleep 1
$D ctl --port $PORT set batch_size=32 scale_lr=true
wait $JOB
