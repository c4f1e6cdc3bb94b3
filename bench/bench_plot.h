/*  bench_plot.h - charts of kvpool-bench's figures (bench_plot.c): kvpool-bench --plot DIR. */
#ifndef BENCH_PLOT_H_INCLUDED
#define BENCH_PLOT_H_INCLUDED

#include <stddef.h>

#define BENCH_PLOT_POINTS 8
#define BENCH_PLOT_SERIES 8

typedef struct {
    const char *title;
    double y[BENCH_PLOT_POINTS]; //  NAN (or <= 0): no figure at that point
} bench_plot_series_t;

typedef struct {
    const char *title;
    double value; //  a horizontal line (NAN: left out)
} bench_plot_reference_t;

typedef struct {
    const char *name; //  the files: NAME.dat, NAME.png
    const char *title, *xlabel, *ylabel;
    int points;
    double x[BENCH_PLOT_POINTS]; //  value sizes in bytes
    int series_count;
    bench_plot_series_t series[BENCH_PLOT_SERIES];
    int reference_count;
    bench_plot_reference_t references[2];
} bench_plot_t;

//  Writes DIR/NAME.dat for each plot and DIR/plots.gp, and runs gnuplot on it to draw
//  DIR/NAME.png. dir must exist. Returns 0, or -1 with the reason in why.
int bench_plot_write (const char *dir, const bench_plot_t *plots, int count, char *why,
                      size_t why_size);

#endif
