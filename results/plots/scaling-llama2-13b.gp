# made by: parallax plot scaling scenarios/llama2-13b-zero3-h100.json --nodes 1,2,4,8,16,32 --out results/plots/scaling-llama2-13b
# draw again: cd results/plots && gnuplot scaling-llama2-13b.gp (reads scaling-llama2-13b.dat; override with -e, e.g.
#   gnuplot -e "formats='png'; png_out='other.png'" scaling-llama2-13b.gp)
if (!exists("datafile")) datafile = "scaling-llama2-13b.dat"
if (!exists("png_out")) png_out = "scaling-llama2-13b.png"
if (!exists("svg_out")) svg_out = "scaling-llama2-13b.svg"
if (!exists("formats")) formats = "png svg"
do for [fmt in formats] {
reset
if (fmt eq "png") {
	set terminal pngcairo size 1200,750 noenhanced font "DejaVu Sans,11"
	set output png_out
} else {
	set terminal svg size 1200,750 dynamic noenhanced font "DejaVu Sans,11" background "#ffffff"
	set output svg_out
}
set title "Scaling: llama2-13b-zero3-h100 on H100-SXM nodes of 8 GPUs (tp 1, pp 1)\nper data-parallel rank micro-batch 4 x accumulation 8, seq 4096; the global batch grows with dp"
set datafile missing "-"
set xlabel "GPUs (nodes x 8; log2 scale)"
set ylabel "training throughput (tokens/s, log scale; k = 10^3, M = 10^6)" tc rgb "#1f5fa0"
set y2label "memory per GPU at its peak (GiB = 2^30 bytes)" tc rgb "#b35900"
set logscale x 2
set logscale y 10
set xrange [6.15385:332.8]
set y2range [0:91.5946]
# the data file is in GiB; u converts to the right axis' unit
u = 1
set yrange [14209.6:1.81883e+06]
set ytics ("20k" 20000, "50k" 50000, "100k" 100000, "200k" 200000, "500k" 500000, "1M" 1000000)
set xtics ("8" 8, "16" 16, "32" 32, "64" 64, "128" 128, "256" 256)
set ytics nomirror tc rgb "#1f5fa0"
set y2tics tc rgb "#b35900"
set grid xtics ytics lc rgb "#dddddd"
set key outside right top vertical reverse Left samplen 3 spacing 1.3
set arrow 1 from graph 0, second 79.6475 to graph 1, second 79.6475 nohead lw 2 dt 2 lc rgb "#c00000"
plot \
	(x >= 8 && x <= 256 ? 3552.39698*x : NaN) with lines dt 3 lw 1.5 lc rgb "#7f9fbf" title "linear from the first point", \
	datafile using 2:5 with linespoints lw 2 pt 7 ps 1.2 lc rgb "#1f5fa0" title "tokens/s (left axis)", \
	datafile using 2:(u*$8) axes x1y2 with linespoints lw 2 pt 5 ps 1.2 lc rgb "#b35900" title "memory peak per GPU (right axis)", \
	NaN with lines lw 2 dt 2 lc rgb "#c00000" title "GPU capacity 79.6 GiB (right axis)"
set output
}
