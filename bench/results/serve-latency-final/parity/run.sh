set -x
cd /work/main && source .venv/bin/activate
P=/tmp/par
for ds in criteo-10k frappe-86k; do
  spec=examples/${ds%%-*}.yaml
  offgraph data $ds --out $P/data-$ds
  f=$(ls $P/data-$ds/*.parquet | head -1)
  offgraph train --spec $spec --data $f --out $P/run-$ds --epochs 1 --no-progress
  offgraph export --run $P/run-$ds --out $P/models/$ds/1 --quant fp32 --shards 2
  offgraph check --model $P/models/$ds/1 --run $P/run-$ds --data $f --limit 3000 --json $P/check-$ds.json
  echo "RC $ds $?"
done
offgraph export --run out/demo/run --out $P/models/movielens/1 --quant fp32 --shards 4
offgraph check --model $P/models/movielens/1 --run out/demo/run --data out/demo/data/movielens.parquet --limit 3000 --json $P/check-movielens.json; echo "RC movielens $?"
offgraph check --model /tmp/b29/oldmodels/movielens/1 --run out/demo/run --data out/demo/data/movielens.parquet --limit 3000 --json $P/check-old.json; echo "RC old $?"
offgraph check --model /tmp/b29/models/movielens/1 --run out/demo/run --data out/demo/data/movielens.parquet --limit 3000 --json $P/check-int8.json; echo "RC int8 $?"
