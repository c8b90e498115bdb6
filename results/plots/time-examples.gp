# made by: parallax plot time scenarios/gpt3-175b-tp8-pp8-a100.json scenarios/llama2-70b-tp8-zero1-h100.json scenarios/mixtral-8x7b-ep8-h100.json --out results/plots/time-examples
# draw again: cd results/plots && gnuplot time-examples.gp (reads time-examples.dat; override with -e, e.g.
#   gnuplot -e "formats='png'; png_out='other.png'" time-examples.gp)
if (!exists("datafile")) datafile = "time-examples.dat"
if (!exists("png_out")) png_out = "time-examples.png"
if (!exists("svg_out")) svg_out = "time-examples.svg"
if (!exists("formats")) formats = "png svg"
do for [fmt in formats] {
reset
if (fmt eq "png") {
	set terminal pngcairo size 1200,530 noenhanced font "DejaVu Sans,11"
	set output png_out
} else {
	set terminal svg size 1200,530 dynamic noenhanced font "DejaVu Sans,11" background "#ffffff"
	set output svg_out
}
set title "Where the step time goes: 3 scenarios\nthe slowest pipeline stage's compute stream; exposed comm = communication not hidden behind compute"
set xlabel "time per optimizer step (s)"
set xrange [0:54.43]
set yrange [-0.6:2.6]
set ytics scale 0
set grid xtics lc rgb "#dddddd"
set style fill solid 0.9 border rgb "#404040"
set key outside right top reverse Left samplen 2
set rmargin 30
plot \
	datafile using ((sum [j=3:2] column(j)) + $3/2):1:(sum [j=3:2] column(j)):(sum [j=3:3] column(j)):($1-0.3):($1+0.3):ytic(sprintf("%s\n%.3g s/step, MFU %.1f%%\n%.0f tokens/s, %d GPUs", strcol(2), $17, 100*$19, $18, int($20))) with boxxyerror lc rgb "#4e79a7" title "forward", \
	datafile using ((sum [j=3:3] column(j)) + $4/2):1:(sum [j=3:3] column(j)):(sum [j=3:4] column(j)):($1-0.3):($1+0.3) with boxxyerror lc rgb "#76b7b2" title "backward", \
	datafile using ((sum [j=3:4] column(j)) + $5/2):1:(sum [j=3:4] column(j)):(sum [j=3:5] column(j)):($1-0.3):($1+0.3) with boxxyerror lc rgb "#a0cbe8" title "recompute", \
	datafile using ((sum [j=3:5] column(j)) + $6/2):1:(sum [j=3:5] column(j)):(sum [j=3:6] column(j)):($1-0.3):($1+0.3) with boxxyerror lc rgb "#f28e2b" title "optimizer", \
	datafile using ((sum [j=3:6] column(j)) + $7/2):1:(sum [j=3:6] column(j)):(sum [j=3:7] column(j)):($1-0.3):($1+0.3) with boxxyerror lc rgb "#bab0ac" title "pipeline bubble", \
	datafile using ((sum [j=3:8] column(j)) + $9/2):1:(sum [j=3:8] column(j)):(sum [j=3:9] column(j)):($1-0.3):($1+0.3) with boxxyerror lc rgb "#e15759" title "exposed comm (dp)", \
	datafile using ((sum [j=3:9] column(j)) + $10/2):1:(sum [j=3:9] column(j)):(sum [j=3:10] column(j)):($1-0.3):($1+0.3) with boxxyerror lc rgb "#b07aa1" title "exposed comm (tp)", \
	datafile using ((sum [j=3:10] column(j)) + $11/2):1:(sum [j=3:10] column(j)):(sum [j=3:11] column(j)):($1-0.3):($1+0.3) with boxxyerror lc rgb "#59a14f" title "exposed comm (pp)", \
	datafile using ((sum [j=3:11] column(j)) + $12/2):1:(sum [j=3:11] column(j)):(sum [j=3:12] column(j)):($1-0.3):($1+0.3) with boxxyerror lc rgb "#edc948" title "exposed comm (ep)", \
	datafile using ((sum [j=3:13] column(j)) + $14/2):1:(sum [j=3:13] column(j)):(sum [j=3:14] column(j)):($1-0.3):($1+0.3) with boxxyerror lc rgb "#8cd17d" title "exposed comm (edp)"
set output
}
