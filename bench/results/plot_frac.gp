# Fraction of the same-size warm read bandwidth reached by decode attention, against N, from
# the CSVs that `bench_attention --sweep --csv FILE` writes. One line per (file, threads).
#   gnuplot -e "files='A.csv B.csv'; out='bench/results/frac-vs-n.png'" bench/results/plot_frac.gp
if (!exists("files")) files = 'bench/results/sweep-before-5runs.csv bench/results/sweep-after-avx512-5runs.csv'
if (!exists("out")) out = 'bench/results/frac-vs-n.png'
# ycol: 8 = fraction of the same-size read bandwidth (bars: min..max), 15 = fraction of the
# roofline min(read, FMA peak / 2 flop per byte)
if (!exists("ycol")) ycol = 8
# kind: the CSV rows drawn (decode = 32 q / 8 kv; decode-mqa, decode-kv2: few KV heads)
if (!exists("kind")) kind = 'decode'
set terminal pngcairo size 900,560 font ",10"
set output out
set datafile separator ','
set datafile commentschars '#'
set logscale x 2
set xrange [192:87381]
set yrange [0:1.2]
set xtics ("256" 256, "1K" 1024, "4K" 4096, "16K" 16384, "64K" 65536)
set xlabel kind eq 'decode' ? 'N (cached tokens; 32 q / 8 kv heads, d 128, f32)' : \
           sprintf('N (cached tokens; %s, d 128, f32)', kind eq 'decode-mqa' ? '8 q / 1 kv head' : '8 q / 2 kv heads')
if (ycol == 15) {
  set ylabel 'decode bytes/s / min(read bytes/s, FMA peak / 2 flop per byte)'
  set title 'kvprune decode attention: fraction of the roofline (medians)'
} else {
  set ylabel 'decode bytes/s / same-size warm read bytes/s'
  set title 'kvprune decode attention: fraction of read bandwidth (medians; bars: min..max)'
}
set grid
set key bottom left
set arrow from 192,0.8 to 87381,0.8 nohead dt 2 lc rgb 'gray40'
set arrow from 192,1.0 to 87381,1.0 nohead dt 3 lc rgb 'gray60'
label(f) = system("basename ".f." .csv")
rows(f, t) = sprintf("< awk -F, '$1 == \"%s\" && $3 == %d' %s", kind, t, f)
if (ycol == 15) {
  plot for [f in files] for [t=1:2] rows(f, t) using 2:15 with linespoints \
       title sprintf("%s, %d thread%s", label(f), t, t > 1 ? "s" : "")
} else {
  plot for [f in files] for [t=1:2] rows(f, t) using 2:8:9:10 with yerrorlines \
       title sprintf("%s, %d thread%s", label(f), t, t > 1 ? "s" : "")
}
