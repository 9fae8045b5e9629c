#!/usr/bin/env bash
# Prints the model-zoo table in Markdown: every configs/models/**/*.yaml with its trainable
# parameters (beside the reference count where there is one), GMACs per image at its own resolution,
# and the config path. Runs `summary --json` on each, so build it first.
# Usage: scripts/model_zoo_table.sh [build-dir]        (default: build)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
summary=$build/apps/summary
if [ ! -x "$summary" ]; then
  echo "model_zoo_table: $summary not found; build it first: ninja -C $build summary" >&2
  exit 1
fi

# Reference counts: trainable parameters of the authors' models (10 classes at 3x32x32 for the
# CIFAR families, 1000 classes at 3x224x224 for the MetaFormers).
declare -A spec=(
  [vit_s]=9622512 [ska_vit_s]=9478896 [cska_vit_s]=10049568
  [cait_s]=12685322 [ska_cait_s]=13503050 [cska_cait_s]=12885002
  [swin_t]=26598646 [ska_swin_t]=24577270 [cska_swin_t]=26883574
  [cvt_13]=19616330 [ska_cvt_13]=19694000 [cska_cvt_13]=18074030
  [caformer_s18]=26341656 [convformer_s18]=26774448 [cskaformer_s18]=28983186
  [skaformer_s18]=23565336 [caformer_b36]=98753614 [cskaformer_b36]=119492662
)

# "26341656" -> "26,341,656"
thousands() { printf "%s" "$1" | rev | sed -E 's/([0-9]{3})/\1,/g; s/,$//' | rev; }

echo "| model | trainable params | reference params | GMACs | input | config |"
echo "|---|---:|---:|---:|---|---|"
while IFS= read -r config; do
  relative=${config#"$root"/}
  name=${relative#configs/models/}
  name=${name%.yaml}
  if ! json=$("$summary" --config "$config" --json --depth 0 2>/tmp/model_zoo_table.$$); then
    echo "| $name | error: $(head -n 1 /tmp/model_zoo_table.$$) | | | | \`$relative\` |"
    continue
  fi
  read -r params gmacs input < <(printf "%s" "$json" | python3 -c '
import json, sys
s = json.load(sys.stdin)
print(s["trainable_params"], "%.3f" % s["gmacs"], "x".join(str(d) for d in s["input"][1:]))')
  expected=""
  if [ -n "${spec[$name]:-}" ]; then
    if [ "${spec[$name]}" = "$params" ]; then
      expected="$(thousands "${spec[$name]}") (equal)"
    else
      expected="$(thousands "${spec[$name]}") (**differs**)"
    fi
  fi
  echo "| $name | $(thousands "$params") | $expected | $gmacs | $input | \`$relative\` |"
done < <(find "$root/configs/models" -name '*.yaml' | sort)
rm -f /tmp/model_zoo_table.$$
