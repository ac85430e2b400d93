#!/usr/bin/env bash
# Reproduce the per-arm figures of docs/RESULTS.md (the forms of the paper's Figures 2 and 3) on mnist10k.
# Needs the classifier and the three paper-setting denoisers (README "A five-minute tour"):
#   CLF=runs/classifier  DEN=runs/training  (DEN/{nodp,sepdp,transdenoiser,transdenoiser_sigma010})
# The paper's whole comparison (every arm and baseline, Figures 2, 3, 4 and 7, mnist10k and Fashion-MNIST):
# scripts/reproduce.sh (docs/REPRODUCTION.md).
# Usage: scripts/paper_figures.sh [OUT]   (default OUT=runs/figures). Each step resumes or is skipped if done.
set -euo pipefail
CLF=${CLF:-runs/classifier}
DEN=${DEN:-runs/training}
OUT=${1:-runs/figures}
IMAGES_SKIP=${IMAGES_SKIP:-20}      # certify every 20th test image (101 images, 9-11 per class)
CERT_N=${CERT_N:-1000}
ATTACK_MAX=${ATTACK_MAX:-30}        # attack 30 test images, evenly spread over the classes
TD=${TD:-transdenoiser}
mkdir -p "$OUT"
run() { echo "+ transdenoiser $*" >&2; transdenoiser "$@" --device cpu; }

# Figure 2 form: certified accuracy vs L2 radius for each arm, sigma 0.1, and no denoiser.
run certify --classifier "$CLF" --sigma 0.25 --n0 100 --n "$CERT_N" --alpha 0.001 --skip "$IMAGES_SKIP" \
    --out "$OUT/certify_none"
for arm in nodp sepdp transdenoiser; do
  run certify --classifier "$CLF" --denoiser "$DEN/$arm" --sigma 0.25 --n0 100 --n "$CERT_N" --alpha 0.001 \
      --skip "$IMAGES_SKIP" --out "$OUT/certify_$arm"
done
run certify --classifier "$CLF" --denoiser "$DEN/transdenoiser_sigma010" --sigma 0.1 --n0 100 --n "$CERT_N" \
    --alpha 0.001 --skip "$IMAGES_SKIP" --out "$OUT/certify_transdenoiser_sigma010"
run report "$OUT"/certify_none "$OUT"/certify_nodp "$OUT"/certify_sepdp "$OUT"/certify_transdenoiser \
    "$OUT"/certify_transdenoiser_sigma010 --out "$OUT/figure2"

# The audit of the transdenoiser arm's certificates.
run audit "$OUT/certify_transdenoiser" --max 30 --out "$OUT/audit_transdenoiser" || echo "AUDIT FAILED" >&2

# Figure 3 form: accuracy under attack, four L2 attacks x three threat models x three arms.
for arm in nodp sepdp transdenoiser; do
  for threat in classifier pipeline smoothed; do
    for attack in fgsm ifgsm mim pgd; do
      dir="$OUT/attack_${arm}_${threat}_${attack}"
      [ -f "$dir/attack.json" ] && continue
      run attack --classifier "$CLF" --denoiser "$DEN/$arm" --attack "$attack" --norm l2 --eps 0.5,1,1.5,2 \
          --threat "$threat" --sigma 0.25 --steps 5 --eot 4 --n 100 --alpha 0.001 --max-images "$ATTACK_MAX" --out "$dir"
    done
    run report "$OUT"/attack_${arm}_${threat}_* --out "$OUT/figure3_${arm}_${threat}"
  done
done
