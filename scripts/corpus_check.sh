#!/bin/sh
# corpus_check.sh: price every model config against every DeepSpeed config, as a new user with
# their own files would, and list what is refused.
#
# Every pair of scenarios/models/*.json x (tests/corpus/deepspeed/*.json, scenarios/deepspeed/*.json)
# becomes one scenario on 2 nodes x 8 H100-SXM, with Hugging Face training_args that fill the
# "auto" values (per-device batch 4, accumulation 2, bf16, lr 2e-5, 1000 steps, 100 warm-up
# steps, gradient checkpointing). A DeepSpeed config whose fixed batch keys were written for
# another data-parallel size says so in a "_world_size" comment key, and gets 1 x N (N <= 8) or
# N/8 x 8 GPUs instead. All scenarios are priced by one `parallax predict --no-db --keep-going`.
#
# A refused pair is expected only when its DeepSpeed config, model and reason match a line of the
# expected-refusals file (tests/corpus/expected_refusals.txt: DeepSpeed's own refusals, each with
# its reason). The script prints every refusal, a summary, and exits 1 when a refusal is not
# expected or an expected one did not happen (the list stays true), 2 on bad usage, 0 otherwise.
#
# usage: scripts/corpus_check.sh [--bin PARALLAX] [--models DIR] [--deepspeed DIR]...
#                                [--expected FILE] [--keep DIR]
#   --deepspeed may be repeated; given once, it replaces both default folders.
#   --keep DIR writes the generated scenarios there (and keeps them) instead of a temporary folder.
set -u

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${PX_BIN:-$root/build/rel/parallax}
models=$root/scenarios/models
ds_dirs=
expected=$root/tests/corpus/expected_refusals.txt
keep=

usage() {
	sed -n 's/^# \{0,1\}//; /^usage:/,/^--keep/p' "$0" >&2
	exit 2
}

while [ $# -gt 0 ]; do
	case $1 in
	--bin) bin=$2; shift 2 ;;
	--models) models=$2; shift 2 ;;
	--deepspeed) ds_dirs="$ds_dirs $2"; shift 2 ;;
	--expected) expected=$2; shift 2 ;;
	--keep) keep=$2; shift 2 ;;
	-h|--help) usage ;;
	*) echo "corpus_check.sh: unknown argument '$1'" >&2; usage ;;
	esac
done
[ -n "$ds_dirs" ] || ds_dirs="$root/tests/corpus/deepspeed $root/scenarios/deepspeed"
[ -x "$bin" ] || { echo "corpus_check.sh: $bin: no parallax binary (make first)" >&2; exit 2; }
[ -f "$expected" ] || { echo "corpus_check.sh: $expected: no such file" >&2; exit 2; }

if [ -n "$keep" ]; then
	work=$keep
	mkdir -p "$work" || exit 2
else
	work=$(mktemp -d "${TMPDIR:-/tmp}/px_corpus.XXXXXX") || exit 2
	trap 'rm -rf "$work"' EXIT
	trap 'exit 130' INT TERM
fi

# ---- one scenario per pair ----
n_models=0
for m in "$models"/*.json; do
	[ -f "$m" ] && n_models=$((n_models + 1))
done
n_ds=0
list=$work/scenarios.txt
: > "$list"
for dir in $ds_dirs; do
	for d in "$dir"/*.json; do
		[ -f "$d" ] || continue
		n_ds=$((n_ds + 1))
		dname=$(basename "$d" .json)
		world=$(sed -n 's/.*"_world_size"[[:space:]]*:[[:space:]]*\([0-9][0-9]*\).*/\1/p' "$d" |
			head -n 1)
		nodes=2 per=8
		if [ -n "$world" ]; then
			if [ "$world" -gt 8 ]; then nodes=$((world / 8)) per=8; else nodes=1 per=$world; fi
		fi
		for m in "$models"/*.json; do
			[ -f "$m" ] || continue
			mname=$(basename "$m" .json)
			f=$work/$mname@$dname.json
			cat > "$f" <<EOF
{"name": "$mname@$dname", "model": "$m", "deepspeed": "$d",
 "cluster": {"gpu": "H100-SXM", "nodes": $nodes, "gpus_per_node": $per},
 "training_args": {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2,
  "bf16": true, "learning_rate": 2e-5, "max_steps": 1000, "warmup_steps": 100,
  "gradient_checkpointing": true}}
EOF
			echo "$f" >> "$list"
		done
	done
done
total=$(wc -l < "$list")
echo "# corpus: $n_models model configs x $n_ds DeepSpeed configs = $total scenarios" \
	"(2 x 8 H100-SXM unless _world_size says otherwise)"
[ "$total" -gt 0 ] || { echo "corpus_check.sh: no pairs to price" >&2; exit 2; }

# ---- price them all in one call ----
# the list is passed in chunks by xargs; each chunk is one --keep-going call
xargs "$bin" predict --no-db --keep-going < "$list" > "$work/out.txt" 2> "$work/err.txt"
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 123 ]; then
	# 123: some call exited 1-125, i.e. 2 = refusals (checked below); anything else is a crash
	echo "corpus_check.sh: parallax exited with status $rc" >&2
	cat "$work/err.txt" >&2
	exit 1
fi
if grep -v '^parallax predict: refused ' "$work/err.txt" | grep -q .; then
	echo "corpus_check.sh: parallax failed:" >&2
	grep -v '^parallax predict: refused ' "$work/err.txt" >&2
	exit 1
fi

# ---- refusals against the expected list ----
# expected_refusals.txt: "DS_CONFIG MODEL_GLOB FRAGMENT...", "#" comments; the fragment is a part of
# the message, the rest of the line after it a reason in parentheses (printed)
unexpected=0 expected_n=0
sed -n 's/^parallax predict: refused //p' "$work/err.txt" > "$work/refused.txt"
: > "$work/matched.txt"
while IFS= read -r line; do
	path=${line%%: *}
	msg=${line#*: }
	pair=$(basename "$path" .json)
	mname=${pair%@*} dname=${pair#*@}
	hit=
	n=0
	while read -r eds eglob efrag; do
		n=$((n + 1))
		case $eds in ''|'#'*) continue ;; esac
		[ "$eds" = "$dname" ] || continue
		case $mname in $eglob) ;; *) continue ;; esac
		frag=${efrag%% (*}
		case $msg in *"$frag"*) hit=$n; break ;; esac
	done < "$expected"
	if [ -n "$hit" ]; then
		expected_n=$((expected_n + 1))
		printf '%s|%s\n' "$hit" "$msg" >> "$work/matched.txt"
	else
		unexpected=$((unexpected + 1))
		echo "UNEXPECTED $mname x $dname: $msg"
	fi
done < "$work/refused.txt"

# one line per expected refusal: how many pairs it covered, the first message and the reason
stale=0 n=0
while read -r eds eglob efrag; do
	n=$((n + 1))
	case $eds in ''|'#'*) continue ;; esac
	count=$(grep -c "^$n|" "$work/matched.txt")
	if [ "$count" -eq 0 ]; then
		stale=$((stale + 1))
		echo "STALE      $expected:$n: $eds $eglob $efrag: no pair was refused so"
	else
		echo "expected   $eds x $count model(s) matching '$eglob': $(grep -m 1 "^$n|" \
			"$work/matched.txt" | cut -d '|' -f 2-)"
		echo "           reason: (${efrag#* (}"
	fi
done < "$expected"

refused=$((expected_n + unexpected))
echo "# $total scenarios: $((total - refused)) priced, $refused refused ($expected_n expected," \
	"$unexpected not expected); $stale expected refusals that did not happen"
[ $unexpected -eq 0 ] && [ $stale -eq 0 ]
