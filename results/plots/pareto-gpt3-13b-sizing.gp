# made by: parallax plot pareto gpt3-13b-sizing
# draw again: cd results/plots && gnuplot pareto-gpt3-13b-sizing.gp (reads pareto-gpt3-13b-sizing.dat; override with -e, e.g.
#   gnuplot -e "formats='png'; png_out='other.png'" pareto-gpt3-13b-sizing.gp)
if (!exists("datafile")) datafile = "pareto-gpt3-13b-sizing.dat"
if (!exists("png_out")) png_out = "pareto-gpt3-13b-sizing.png"
if (!exists("svg_out")) svg_out = "pareto-gpt3-13b-sizing.svg"
if (!exists("formats")) formats = "png svg"
do for [fmt in formats] {
reset
if (fmt eq "png") {
	set terminal pngcairo size 1500,700 noenhanced font "DejaVu Sans,11"
	set output png_out
} else {
	set terminal svg size 1500,700 dynamic noenhanced font "DejaVu Sans,11" background "#ffffff"
	set output svg_out
}
set multiplot title "Sweep gpt3-13b-sizing (1): 3642 configurations fit and were timed of 7776 (534 do not fit, 3600 refused)"
set datafile missing "-"
set grid xtics ytics lc rgb "#dddddd"
set logscale xy 10
set key top right box opaque samplen 2
set origin 0,0
set size 0.5,0.94
set title "time against cost: the front is the lower-left edge"
set xlabel "cost, USD per million tokens (log scale)"
set ylabel "hours per billion tokens (log scale)"
set xrange [0.417612:10.6747]
set yrange [0.153812:160.411]
set xtics ("0.5" 0.5, "1" 1, "2" 2, "5" 5, "10" 10)
set ytics ("0.2" 0.2, "0.5" 0.5, "1" 1, "2" 2, "5" 5, "10" 10, "20" 20, "50" 50, "100" 100)
plot \
	datafile index 0 using 5:4 with points pt 7 ps 0.6 lc rgb "#4e79a7" title "A100-40GB", \
	datafile index 1 using 5:4 with points pt 7 ps 0.6 lc rgb "#f28e2b" title "A100-80GB", \
	datafile index 2 using 5:4 with points pt 7 ps 0.6 lc rgb "#59a14f" title "H100-SXM", \
	datafile index 3 using 5:4 with points pt 7 ps 0.6 lc rgb "#e15759" title "H200", \
	datafile index 4 using 5:4 with linespoints lw 2 pt 6 ps 1.4 lc rgb "#000000" title "Pareto front"
set origin 0.5,0
set size 0.5,0.94
set logscale x 2
set key top left box opaque samplen 2
set title "throughput against GPUs: the front is the upper-left edge"
set xlabel "GPUs (log2 scale)"
set ylabel "tokens/s (log scale)"
set xrange [5.33333:384]
set yrange [2131.28:2.22272e+06]
set xtics auto
set ytics ("5k" 5000, "10k" 10000, "20k" 20000, "50k" 50000, "100k" 100000, "200k" 200000, "500k" 500000, "1M" 1000000, "2M" 2000000)
plot \
	datafile index 0 using 2:3 with points pt 7 ps 0.6 lc rgb "#4e79a7" title "A100-40GB", \
	datafile index 1 using 2:3 with points pt 7 ps 0.6 lc rgb "#f28e2b" title "A100-80GB", \
	datafile index 2 using 2:3 with points pt 7 ps 0.6 lc rgb "#59a14f" title "H100-SXM", \
	datafile index 3 using 2:3 with points pt 7 ps 0.6 lc rgb "#e15759" title "H200", \
	datafile index 5 using 2:3 with steps lw 2 lc rgb "#000000" notitle, \
	datafile index 5 using 2:3 with points pt 6 ps 1.4 lc rgb "#000000" title "Pareto front"
unset multiplot
set output
}
