# made by: parallax plot zero --db results/zero-cpu.db --out results/plots/zero-gpt2-mini-cpu-zero3
# draw again: cd results/plots && gnuplot zero-gpt2-mini-cpu-zero3.gp (reads zero-gpt2-mini-cpu-zero3.dat; override with -e, e.g.
#   gnuplot -e "formats='png'; png_out='other.png'" zero-gpt2-mini-cpu-zero3.gp)
if (!exists("datafile")) datafile = "zero-gpt2-mini-cpu-zero3.dat"
if (!exists("png_out")) png_out = "zero-gpt2-mini-cpu-zero3.png"
if (!exists("svg_out")) svg_out = "zero-gpt2-mini-cpu-zero3.svg"
if (!exists("formats")) formats = "png svg"
do for [fmt in formats] {
reset
if (fmt eq "png") {
	set terminal pngcairo size 1300,760 noenhanced font "DejaVu Sans,11"
	set output png_out
} else {
	set terminal svg size 1300,760 dynamic noenhanced font "DejaVu Sans,11" background "#ffffff"
	set output svg_out
}
set title "Per-rank memory by ZeRO stage and data-parallel ranks: gpt2-mini-cpu-zero3"
set ylabel "GiB per rank (rank 0, at its peak)"
set xlabel "ZeRO stage (Z) and data-parallel ranks (N)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border rgb "#404040"
set boxwidth 0.9
set yrange [0:*]
set grid ytics lc rgb "#dddddd"
set key top right box opaque
set xtics rotate by -30 nomirror
set label 1 "measured: the executor's tracking allocator (this backend has no device reading)\nideal: model states only, (2 + 2 + K) x params / N partitioned by stage (ZeRO paper, Table 1)" at screen 0.01, screen 0 offset 0, 2 left tc rgb "#404040"
set bmargin 6
plot datafile using 5:xtic(1) title "predicted" lc rgb "#4e79a7", \
	'' using 6 title "measured" lc rgb "#f28e2b", \
	'' using 7 title "ZeRO ideal (model states)" lc rgb "#bab0ac"
set output
}
