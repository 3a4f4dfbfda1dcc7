#!/usr/bin/env bash
# Nsight Compute on one kernel launch of scripts/profile_kernels.py (the third call of the kernels that
# KERNEL_REGEX matches), exported as text: OUT.details.txt (speed of light, warp states, instruction
# statistics) and OUT.source.csv (per SASS instruction: executed count and stall samples by reason).
#
# usage: scripts/ncu_source.sh OUT KERNEL_REGEX [profile_kernels.py arguments]
#   e.g. scripts/ncu_source.sh /tmp/mask_add0 hopper_fwd --shape 8,12,512,64 --mask add0
#   NCU_METRICS  extra --metrics (comma-separated names, or regex:...), e.g. the pipes' utilization:
#                "regex:^sm__(inst_executed_pipe_|pipe_).*avg.pct_of_peak_sustained_active$"
set -euo pipefail
out=$1 regex=$2
shift 2
ncu_bin=${NCU:-$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -n 1)}
[ -x "$ncu_bin" ] || { echo "ncu not found (set NCU)" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
# --clock-control none: the card's clocks as they are (the default locks them at base clock).
"$ncu_bin" -f -k "regex:$regex" --launch-skip 2 --launch-count 1 --clock-control none --section SpeedOfLight \
  --section WarpStateStats --section InstructionStats --section SchedulerStats --section SourceCounters \
  --section ComputeWorkloadAnalysis ${NCU_METRICS:+--metrics "$NCU_METRICS"} \
  -o "$out" python3 "$here/profile_kernels.py" "$@" > "$out.log" 2>&1
"$ncu_bin" -i "$out.ncu-rep" --page details > "$out.details.txt"
"$ncu_bin" -i "$out.ncu-rep" --page source --csv --print-source sass > "$out.source.csv"
rm -f "$out.ncu-rep"
