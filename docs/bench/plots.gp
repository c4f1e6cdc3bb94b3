# kvpool-bench --plot: redraw with `gnuplot docs/bench/plots.gp`

# get, batches of 32 values: throughput (higher is better)
reset
set terminal pngcairo size 1000,620 font 'sans,11'
set output 'docs/bench/get-throughput.png'
set title "get, batches of 32 values: throughput (higher is better)"
set xlabel "value size"
set ylabel "GB/s"
set logscale x 2
set logscale y 10
set grid
set key below
set datafile missing 'NaN'
set xtics ("4 KiB" 4096, "64 KiB" 65536, "1 MiB" 1048576, "4 MiB" 4194304)
plot 'docs/bench/get-throughput.dat' using 1:2 with linespoints lw 2 title "kvpool tcp", \
  'docs/bench/get-throughput.dat' using 1:3 with linespoints lw 2 title "kvpool tcp, zero-copy get", \
  'docs/bench/get-throughput.dat' using 1:4 with linespoints lw 2 title "kvpool same-machine", \
  'docs/bench/get-throughput.dat' using 1:5 with linespoints lw 2 title "redis (its faster batched form)", \
  24.4383 with lines dt 2 lw 2 title "memcpy, one thread", \
  4.55576 with lines dt 2 lw 2 title "loopback tcp (iperf3)"

# put, batches of 32 values: throughput (higher is better)
reset
set terminal pngcairo size 1000,620 font 'sans,11'
set output 'docs/bench/put-throughput.png'
set title "put, batches of 32 values: throughput (higher is better)"
set xlabel "value size"
set ylabel "GB/s"
set logscale x 2
set logscale y 10
set grid
set key below
set datafile missing 'NaN'
set xtics ("4 KiB" 4096, "64 KiB" 65536, "1 MiB" 1048576, "4 MiB" 4194304)
plot 'docs/bench/put-throughput.dat' using 1:2 with linespoints lw 2 title "kvpool tcp", \
  'docs/bench/put-throughput.dat' using 1:3 with linespoints lw 2 title "kvpool same-machine", \
  'docs/bench/put-throughput.dat' using 1:4 with linespoints lw 2 title "redis (its faster batched form)", \
  24.4383 with lines dt 2 lw 2 title "memcpy, one thread", \
  4.55576 with lines dt 2 lw 2 title "loopback tcp (iperf3)"

# get, one value a call: p50 latency (lower is better)
reset
set terminal pngcairo size 1000,620 font 'sans,11'
set output 'docs/bench/get-latency.png'
set title "get, one value a call: p50 latency (lower is better)"
set xlabel "value size"
set ylabel "p50 latency (us)"
set logscale x 2
set logscale y 10
set grid
set key below
set datafile missing 'NaN'
set xtics ("4 KiB" 4096, "64 KiB" 65536, "1 MiB" 1048576, "4 MiB" 4194304)
plot 'docs/bench/get-latency.dat' using 1:2 with linespoints lw 2 title "kvpool tcp", \
  'docs/bench/get-latency.dat' using 1:3 with linespoints lw 2 title "kvpool tcp, zero-copy get", \
  'docs/bench/get-latency.dat' using 1:4 with linespoints lw 2 title "kvpool same-machine", \
  'docs/bench/get-latency.dat' using 1:5 with linespoints lw 2 title "redis", \
  75.002 with lines dt 2 lw 2 title "loopback floor: a bare libzmq echo of 4 KiB"

# put, one value a call: p50 latency (lower is better)
reset
set terminal pngcairo size 1000,620 font 'sans,11'
set output 'docs/bench/put-latency.png'
set title "put, one value a call: p50 latency (lower is better)"
set xlabel "value size"
set ylabel "p50 latency (us)"
set logscale x 2
set logscale y 10
set grid
set key below
set datafile missing 'NaN'
set xtics ("4 KiB" 4096, "64 KiB" 65536, "1 MiB" 1048576, "4 MiB" 4194304)
plot 'docs/bench/put-latency.dat' using 1:2 with linespoints lw 2 title "kvpool tcp", \
  'docs/bench/put-latency.dat' using 1:3 with linespoints lw 2 title "kvpool same-machine", \
  'docs/bench/put-latency.dat' using 1:4 with linespoints lw 2 title "redis", \
  75.002 with lines dt 2 lw 2 title "loopback floor: a bare libzmq echo of 4 KiB"
