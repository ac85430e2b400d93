#!/usr/bin/env bash
# Issue 14 item 5: the arms and the ablation at one (dataset, sigma, epsilon), each trained then certified.
# usage: scripts/measure_recipe.sh DATASET SIGMA EPSILON CLASSIFIER RECIPE_CONFIG OUTDIR IMAGES N [ARM ...]
# N: fixed n per image (e.g. 10000), or estimate:N_MAX for the adaptive estimate mode (`certify --adaptive --n-max`)
# ARM: nodp sepdp transdenoiser public_init sepdp_init sepdp_draws td_merged sepdp_recipe recipe_full
#      none (the classifier alone), retrain (the classifier $RETRAIN_CLASSIFIER alone: `pretrain --noise-sigma SIGMA`),
#      recipe_OBJECTIVE, nodp_OBJECTIVE (OBJECTIVE: stability, classification, stability_mse; issue 66; the
#      recipe's MSE row is recipe_full, public initialisation included, and stability_mse starts from the same
#      public initialisation, so it is the reference's recipe: MSE on the public split, then stability)
# recipe_full and sepdp_recipe train the objective mse whatever RECIPE_CONFIG says (the MSE recipe and its ablation).
# Every heavy command runs under nice -n 10; logs go to OUTDIR/logs.
# CERTIFY_FLAGS: more `certify` flags for every arm, e.g. CERTIFY_FLAGS="--precision bf16" (recorded in each run).
set -euo pipefail
# One torch thread per process: on a shared, oversubscribed machine two threads per process ran ~30x slower.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
dataset=$1 sigma=$2 eps=$3 clf=$4 recipe=$5 out=$6 images=$7 n=$8
shift 8
case $n in
    estimate:*) sampling=(--adaptive --n-max "${n#estimate:}") ;;
    *[!0-9]*|'') echo "measure_recipe.sh: N must be a sample count or estimate:N_MAX, got '$n'" >&2; exit 2 ;;
    *) sampling=(--n "$n") ;;
esac
arms=("$@")
T=${TRANSDENOISER:-.venv/bin/transdenoiser}
mkdir -p "$out/logs"
paper=(--config configs/mnist_sigma025.toml --dataset "$dataset" --sigma "$sigma" --classifier "$clf")
dp=(--target-epsilon "$eps")  # the DP arms' setting: the nodp arm takes no --target-epsilon
# Algorithm 1 needs xi_low <= xi_up: above epsilon 1 the calibrated xi_up can fall below the config's 0.5 (0.483 at
# epsilon 8 on Fashion-MNIST), so the transdenoiser arm there uses 0.25 (as scripts/reproduce.py; with S_min = 0 the
# input multiplier is 0, below either value)
xi_low=(); awk "BEGIN { exit !($eps > 1) }" && xi_low=(--xi-low 0.25)
# every (test size / IMAGES)-th test image, IMAGES of them (Fashion-MNIST: every 20th of 10,000; mnist10k: every 4th of 2,004)
test_size=$(${PYTHON:-.venv/bin/python} -c "from training.datasets import load_dataset; print(len(load_dataset('$dataset').split('test')))")
skip=$(( test_size / images ))
max_index=$(( skip * images ))
train() {  # name, flags...
    local name=$1; shift
    local resume=()
    if [ -f "$out/train/$name/metadata.json" ]; then
        grep -q '"complete": true' "$out/train/$name/metadata.json" && return 0
        resume=(--resume)  # an interrupted run: continue it (train refuses if the settings differ)
    fi
    nice -n 10 $T train "$@" "${resume[@]}" --out "$out/train/$name" >> "$out/logs/train_$name.log" 2>&1
}
certify() {  # name [classifier]: with a second argument, that classifier alone (no denoiser)
    local name=$1 models=(--classifier "$clf" --denoiser "$out/train/$1")
    [ $# -gt 1 ] && models=(--classifier "$2")
    [ -f "$out/cert/$name/summary.json" ] && return 0
    nice -n 10 $T certify "${models[@]}" --dataset "$dataset" --sigma "$sigma" \
        --n0 100 "${sampling[@]}" --alpha 0.001 --skip "$skip" --max-index "$max_index" ${CERTIFY_FLAGS:-} \
        --out "$out/cert/$name" > "$out/logs/cert_$name.log" 2>&1
}
objective() {  # recipe_stability_mse -> stability+mse
    local o=${1#*_}; echo "${o/_mse/+mse}"
}
for arm in "${arms[@]}"; do
    case $arm in
        nodp) train nodp "${paper[@]}" --arm nodp --optimizer adam --lr 1e-3 ;;
        sepdp) train sepdp "${paper[@]}" "${dp[@]}" --arm sepdp ;;
        transdenoiser) train transdenoiser "${paper[@]}" "${dp[@]}" "${xi_low[@]}" --arm transdenoiser ;;
        public_init) train public_init "${paper[@]}" --arm nodp --optimizer adam --lr 1e-3 --train-on public ;;
        sepdp_init) train public_init "${paper[@]}" --arm nodp --optimizer adam --lr 1e-3 --train-on public
                    train sepdp_init "${paper[@]}" "${dp[@]}" --arm sepdp --init-from "$out/train/public_init" ;;
        sepdp_draws) train sepdp_draws "${paper[@]}" "${dp[@]}" --arm sepdp --noise-draws 4 ;;
        td_merged) train td_merged "${paper[@]}" "${dp[@]}" "${xi_low[@]}" --arm transdenoiser --merge-uncredited-noise ;;
        sepdp_recipe) train sepdp_recipe --config "$recipe" --dataset "$dataset" --sigma "$sigma" \
                          --target-epsilon "$eps" --classifier "$clf" --objective mse ;;
        recipe_full) train public_init "${paper[@]}" --arm nodp --optimizer adam --lr 1e-3 --train-on public
                     train recipe_full --config "$recipe" --dataset "$dataset" --sigma "$sigma" --target-epsilon "$eps" \
                         --classifier "$clf" --init-from "$out/train/public_init" --objective mse ;;
        none) certify none "$clf"; continue ;;
        retrain) certify retrain "${RETRAIN_CLASSIFIER:?retrain needs RETRAIN_CLASSIFIER, a pretrain --noise-sigma checkpoint}"
                 continue ;;
        recipe_stability_mse)
                 train public_init "${paper[@]}" --arm nodp --optimizer adam --lr 1e-3 --train-on public
                 train "$arm" --config "$recipe" --dataset "$dataset" --sigma "$sigma" --target-epsilon "$eps" \
                     --classifier "$clf" --objective stability+mse --init-from "$out/train/public_init" ;;
        recipe_stability|recipe_classification)
                 train "$arm" --config "$recipe" --dataset "$dataset" --sigma "$sigma" --target-epsilon "$eps" \
                     --classifier "$clf" --objective "$(objective "$arm")" ;;
        nodp_stability_mse)
                 train public_init "${paper[@]}" --arm nodp --optimizer adam --lr 1e-3 --train-on public
                 train "$arm" "${paper[@]}" --arm nodp --optimizer adam --lr 1e-3 --objective stability+mse \
                     --init-from "$out/train/public_init" ;;
        nodp_stability|nodp_classification)
                 train "$arm" "${paper[@]}" --arm nodp --optimizer adam --lr 1e-3 --objective "$(objective "$arm")" ;;
        *) echo "unknown arm $arm" >&2; exit 2 ;;
    esac
    [ "$arm" = public_init ] || certify "$arm"
done
