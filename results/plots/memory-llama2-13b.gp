# made by: parallax plot memory scenarios/llama2-13b-zero3-h100.json --out results/plots/memory-llama2-13b
# draw again: cd results/plots && gnuplot memory-llama2-13b.gp (reads memory-llama2-13b.dat; override with -e, e.g.
#   gnuplot -e "formats='png'; png_out='other.png'" memory-llama2-13b.gp)
if (!exists("datafile")) datafile = "memory-llama2-13b.dat"
if (!exists("png_out")) png_out = "memory-llama2-13b.png"
if (!exists("svg_out")) svg_out = "memory-llama2-13b.svg"
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
set title "Per-GPU memory at the peak by ZeRO stage: llama2-13b-zero3-h100\n13 B parameters, 32 x H100-SXM (dp 32, tp 1, pp 1), micro-batch 4 x seq 4096"
# the data file is in GiB; u converts to the axis' unit
u = 1
set ylabel "memory per GPU at its peak (GiB = 2^30 bytes)"
set xlabel "ZeRO stage (deepspeed.zero_optimization.stage)"
set xtics ("ZeRO-0" 0, "ZeRO-1" 1, "ZeRO-2" 2, "ZeRO-3 (as given)" 3) scale 0
set xrange [-0.6:3.6]
set yrange [0:199.119]
set grid ytics lc rgb "#dddddd"
set boxwidth 0.6
set style fill solid 0.9 border rgb "#404040"
set key outside right top reverse Left samplen 2
set rmargin 42
set style textbox opaque noborder
set arrow 1 from graph 0, first 79.6475 to graph 1, first 79.6475 nohead lw 2 dt 2 lc rgb "#c00000" back
plot \
	datafile using 1:(u * sum [j=2:7] column(j)) with boxes lc rgb "#bab0ac" title "overhead", \
	datafile using 1:(u * sum [j=2:6] column(j)) with boxes lc rgb "#edc948" title "buffers", \
	datafile using 1:(u * sum [j=2:5] column(j)) with boxes lc rgb "#76b7b2" title "activations", \
	datafile using 1:(u * sum [j=2:4] column(j)) with boxes lc rgb "#f28e2b" title "optimizer", \
	datafile using 1:(u * sum [j=2:3] column(j)) with boxes lc rgb "#59a14f" title "grads", \
	datafile using 1:(u * sum [j=2:2] column(j)) with boxes lc rgb "#4e79a7" title "params", \
	datafile using ($1-0.36):(u*$9):(0.72):(0) with vectors nohead lw 3 dt 2 lc rgb "#000000" title "ZeRO paper's ideal model states", \
	NaN with lines lw 2 dt 2 lc rgb "#c00000" title "GPU capacity 79.6 GiB (H100-SXM)", \
	datafile using 1:(u*$8 > 199.119 ? 185.18 : u*$8):(u*$8 > 199.119 ? sprintf("%.0f GiB\nabove the axis", u*$8) : sprintf("%.2f GiB", u*$8)) with labels boxed offset 0,0.8 notitle
set output
}
