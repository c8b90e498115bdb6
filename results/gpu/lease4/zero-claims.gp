# made by: parallax plot zero gpt2-small-cuda --db results/gpu/lease4/gpu.db --out results/gpu/lease4/zero-claims
# draw again: cd results/gpu/lease4 && gnuplot zero-claims.gp (reads zero-claims.dat; override with -e, e.g.
#   gnuplot -e "formats='png'; png_out='other.png'" zero-claims.gp)
if (!exists("datafile")) datafile = "zero-claims.dat"
if (!exists("png_out")) png_out = "zero-claims.png"
if (!exists("svg_out")) svg_out = "zero-claims.svg"
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
set title "Per-rank memory by ZeRO stage and data-parallel ranks: gpt2-small-cuda"
set ylabel "GiB per rank (rank 0, at its peak)"
set xlabel "ZeRO stage (Z) and data-parallel ranks (N)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border rgb "#404040"
set boxwidth 0.9
set yrange [0:*]
set grid ytics lc rgb "#dddddd"
set datafile missing NaN
set key top right box opaque
set xtics rotate by -30 nomirror
set label 1 "measured: the device's own reading (NVML, else cudaMalloc'd bytes) of each rank's process at its peak\nrequested: what the executor asked for (the schedule's labels)\nideal: model states only, (2 + 2 + K) x params / N partitioned by stage (ZeRO paper, Table 1)" at screen 0.01, screen 0 offset 0, 3 left tc rgb "#404040"
set bmargin 7
plot datafile using 5:xtic(1) title "predicted" lc rgb "#4e79a7", \
	'' using 6 title "measured: device reading" lc rgb "#f28e2b", \
	'' using 10 title "requested (the executor's)" lc rgb "#59a14f", \
	'' using 7 title "ZeRO ideal (model states)" lc rgb "#bab0ac"
set output
}
