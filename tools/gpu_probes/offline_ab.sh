# The offline benchmark from this tree ("new") and from another copy of the package ("base"), in turn,
# each in a fresh process:  BASE=/path/holding/a/minisgl bash tools/gpu_probes/offline_ab.sh [flags]
# MODEL (default models/qwen3-0.6b-dummy), ORDER (default "new base new base") and RUN_TIMEOUT (seconds per run, default 150) can be set.
M=${MODEL:-$(pwd)/models/qwen3-0.6b-dummy}
for v in ${ORDER:-new base new base}; do
  # the package first on the path, and -P: `python -m` would otherwise put this folder (and its package) first
  if [ $v = base ]; then P=${BASE:?set BASE to a folder holding the package to compare}${PYTHONPATH:+:$PYTHONPATH}; else P=$(pwd)${PYTHONPATH:+:$PYTHONPATH}; fi
  pkg=$(PYTHONPATH=$P python3 -P -c 'import minisgl, os; print(os.path.dirname(minisgl.__file__))')
  echo "== $v: $pkg"
  if [ $v = base ] && [ "$pkg" = "$(pwd)/minisgl" ]; then echo "base resolves to this tree (an editable install?): nothing to compare" >&2; exit 2; fi
  PYTHONPATH=$P timeout ${RUN_TIMEOUT:-150} python3 -P -m minisgl.benchmark.offline --model $M "$@" 2>&1 | grep -E "minisgl:|decode,|prefill  "
done
