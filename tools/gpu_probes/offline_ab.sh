# The offline benchmark from this tree and from other copies of the package, in turn, each in a fresh
# process:  BASE=/path/holding/a/minisgl bash tools/gpu_probes/offline_ab.sh [flags]
# ORDER (default "new base new base") names the runs: "new" is this tree, "base" the folder $BASE, any
# other word a folder holding a `minisgl` of its own. MODEL (default models/qwen3-0.6b-dummy),
# RUN_TIMEOUT (seconds per run, default 150) and SCRIPT (a script that takes --model, run instead of
# `-m minisgl.benchmark.offline`) can be set.
M=${MODEL:-$(pwd)/models/qwen3-0.6b-dummy}
for v in ${ORDER:-new base new base}; do
  case $v in
    new) D=$(pwd) ;;
    base) D=${BASE:?set BASE to a folder holding the package to compare} ;;
    *) D=$(cd "$v" && pwd) ;;
  esac
  # the package first on the path, and -P: `python -m` would otherwise put this folder (and its package) first
  P=$D${PYTHONPATH:+:$PYTHONPATH}
  pkg=$(PYTHONPATH=$P python3 -P -c 'import minisgl, os; print(os.path.dirname(minisgl.__file__))')
  echo "== $v: $pkg"
  if [ $v != new ] && [ "$pkg" = "$(pwd)/minisgl" ]; then echo "$v resolves to this tree (an editable install?): nothing to compare" >&2; exit 2; fi
  if [ -n "$SCRIPT" ]; then
    PYTHONPATH=$P timeout ${RUN_TIMEOUT:-150} python3 -P "$SCRIPT" --model $M "$@" 2>&1 | grep -E "package:|run [0-9]|prefill|decode,"
  else
    PYTHONPATH=$P timeout ${RUN_TIMEOUT:-150} python3 -P -m minisgl.benchmark.offline --model $M "$@" 2>&1 | grep -E "minisgl:|decode,|prefill  "
  fi
done
