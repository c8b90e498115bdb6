#!/bin/sh
# The CPU executor's step time, predicted by the time model from this machine's CPU profile
# against measured, for every bundled backend "cpu" scenario at 1, 2 and 4 ranks (issue 14's
# target: within 15%). The profile is calibration data only (parallax calibrate --backend cpu's
# micro-benchmarks); nothing here is fitted to these runs. Measured: the mean of the steady steps,
# the first (warm-up) left out, read from the run's per-step lines.
#
#   PX_BIN=build/rel/parallax sh scripts/bench_cpu_time.sh
#
# PX_CPU_PROFILE: the profile to use (default $PARALLAX_CPU_PROFILE, else results/cpu-profile.json);
# when it does not exist it is measured first (parallax calibrate --backend cpu --ranks 4, a few
# minutes), and PX_CALIBRATE=1 measures it again anyway. PX_STEPS: steps a run (default 8;
# twice that for a 1-bit optimizer's scenario, whose compressed steps come after its warm-up).
# A 1-bit optimizer's run has a row per kind of step (full, compressed, 0/1 Adam's local): the
# run's own per-kind means, each against the prediction of that kind's schedule.
# PX_RANKS: the rank counts (default "1 2 4"). The machine should be otherwise idle: the load
# average before and after is printed, and a loaded machine's figures mean little.
set -eu

bin=${PX_BIN:-build/rel/parallax}
steps=${PX_STEPS:-8}
ranks_list=${PX_RANKS:-"1 2 4"}
profile=${PX_CPU_PROFILE:-${PARALLAX_CPU_PROFILE:-results/cpu-profile.json}}
max_ranks=1
for n in $ranks_list; do [ "$n" -gt "$max_ranks" ] && max_ranks=$n; done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

if [ "${PX_CALIBRATE:-0}" = 1 ] || [ ! -f "$profile" ]; then
	echo "# measuring $profile: $bin calibrate --backend cpu --ranks $max_ranks --out $profile"
	mkdir -p "$(dirname "$profile")"
	"$bin" calibrate --backend cpu --ranks "$max_ranks" --out "$profile" > "$tmp/cal.txt"
	tail -n +2 "$tmp/cal.txt" | grep -v '^# level'
fi

# the training scenarios (an inference one has no training steps to time)
scenarios=$(grep -l '"backend": *"cpu"' scenarios/*.json | xargs grep -L '"inference"' || true)
if [ -z "$scenarios" ]; then
	echo "no backend \"cpu\" scenario in scenarios/" >&2
	exit 1
fi

echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
printf '%-28s %5s %12s %12s %12s %8s %7s\n' scenario ranks "predicted s" "measured s" \
	"(w/ step 1)" "error" "<=15%"
worst=0
for scn in $scenarios; do
	name=$(basename "$scn" .json)
	for n in $ranks_list; do
		log="$tmp/$name-$n.txt"
		rc=0
		s=$steps
		onebit=0
		if grep -q '"OneBitAdam"\|"ZeroOneAdam"\|"OneBitLamb"' "$scn"; then
			s=$((steps * 2)) onebit=1
		fi
		"$bin" run "$scn" --ranks "$n" --steps "$s" --no-db --hw "$profile" \
			> "$log" 2>&1 || rc=$?
		if [ "$rc" = 2 ]; then # a layout this rank count cannot hold (e.g. ep 2 on 1 rank)
			printf '%-28s %5d  refused: %s\n' "$name" "$n" \
				"$(grep -m 1 'parallax run' "$log" | cut -c1-90)"
			continue
		elif [ "$rc" != 0 ]; then
			echo "$name at $n ranks: parallax run failed:" >&2
			tail -5 "$log" >&2
			exit 1
		fi
		# "step    2  loss 5.4054  lr 0.002     639.0 ms ...": the 7th field, in ms
		measured=$(awk '$1 == "step" && $2 > 1 { s += $7; k++ } END { if (k) printf "%.4f", s / k / 1000 }' "$log")
		if [ "$onebit" = 1 ]; then # the full-precision steps' mean, as the run took it
			measured=$(sed -n 's/^# step time: measured \([0-9.]*\) s.*/\1/p; s/^# step time: \([0-9.]*\) s.*/\1/p' "$log")
		fi
		all=$(awk '$1 == "step" { s += $7; k++ } END { if (k) printf "%.4f", s / k / 1000 }' "$log")
		predicted=$(sed -n 's/^# step time: measured .*), predicted \([0-9.e+-]*\) s (.*/\1/p' "$log")
		if [ -z "$predicted" ]; then # a layout the CPU profile cannot price: say why
			printf '%-28s %5d  measured %s s; not priced by the CPU profile (`parallax predict --hw` says why)\n' \
				"$name" "$n" "$measured"
			continue
		fi
		err=$(awk -v p="$predicted" -v m="$measured" 'BEGIN { printf "%+.1f", (p - m) / m * 100 }')
		ok=$(awk -v e="$err" 'BEGIN { print (e <= 15 && e >= -15) ? "yes" : "no" }')
		worst=$(awk -v e="$err" -v w="$worst" 'BEGIN { e = e < 0 ? -e : e + 0; print (e > w ? e : w) }')
		printf '%-28s %5d %12s %12s %12s %7s%% %7s\n' "$name" "$n" "$predicted" "$measured" \
			"$all" "$err" "$ok"
		# "# step time, compressed steps: measured 0.2620 s (the mean of 8), predicted 0.2582 s (-1.5%)"
		grep '^# step time, [a-z]* steps: measured .*, predicted ' "$log" > "$tmp/kinds" || true
		while read -r line; do
			kind=$(echo "$line" | sed 's/^# step time, \([a-z]*\) steps.*/\1/')
			m=$(echo "$line" | sed 's/.*: measured \([0-9.]*\) s.*/\1/')
			p=$(echo "$line" | sed 's/.*, predicted \([0-9.e+-]*\) s.*/\1/')
			e=$(awk -v p="$p" -v m="$m" 'BEGIN { printf "%+.1f", (p - m) / m * 100 }')
			worst=$(awk -v e="$e" -v w="$worst" 'BEGIN { e = e < 0 ? -e : e + 0; print (e > w ? e : w) }')
			printf '%-28s %5d %12s %12s %12s %7s%% %7s\n' "  $kind steps" "$n" "$p" "$m" "-" \
				"$e" "$(awk -v e="$e" 'BEGIN { print (e <= 15 && e >= -15) ? "yes" : "no" }')"
		done < "$tmp/kinds"
	done
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# measured: the mean of steps 2-$steps (step 1, the warm-up, beside it); predicted: the time"
echo "# model with $profile ($("$bin" --version 2>/dev/null | head -1 || echo parallax));"
echo "# worst |error| ${worst}%; target (issue 14): within 15%"
