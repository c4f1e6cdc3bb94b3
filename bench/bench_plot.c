/*  bench_plot.c - kvpool-bench --plot DIR: the figures of a run as PNG charts, drawn by
    gnuplot (Debian's gnuplot-nox).

    Each chart is a data file (DIR/NAME.dat: the x values in the first column, one column a
    series, "NaN" where a series has no figure) and a part of one gnuplot script
    (DIR/plots.gp, kept so that a chart can be redrawn or restyled by hand); gnuplot then
    writes DIR/NAME.png. Value sizes go on a log2 x axis, throughput or latency on a log10 y
    axis; a reference (memcpy, loopback) is a dashed horizontal line.
*/
#include "bench/bench_plot.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"

#define GNUPLOT "/usr/bin/gnuplot"

static int
s_write_data (const char *dir, const bench_plot_t *plot)
{
    char path[4096];
    snprintf (path, sizeof path, "%s/%s.dat", dir, plot->name);
    FILE *file = fopen (path, "w");
    if (!file)
        return -1;
    fprintf (file, "# %s\n# x", plot->title);
    for (int s = 0; s < plot->series_count; s++)
        fprintf (file, "\t\"%s\"", plot->series[s].title);
    fprintf (file, "\n");
    for (int p = 0; p < plot->points; p++) {
        fprintf (file, "%.17g", plot->x[p]);
        for (int s = 0; s < plot->series_count; s++) {
            double y = plot->series[s].y[p];
            if (isfinite (y) && y > 0)
                fprintf (file, "\t%.6g", y);
            else
                fprintf (file, "\tNaN");
        }
        fprintf (file, "\n");
    }
    return fclose (file);
}

static void
s_write_script (FILE *gp, const char *dir, const bench_plot_t *plot)
{
    fprintf (gp, "\n# %s\nreset\n", plot->title);
    fprintf (gp, "set terminal pngcairo size 1000,620 font 'sans,11'\n");
    fprintf (gp, "set output '%s/%s.png'\n", dir, plot->name);
    fprintf (gp, "set title \"%s\"\n", plot->title);
    fprintf (gp, "set xlabel \"%s\"\nset ylabel \"%s\"\n", plot->xlabel, plot->ylabel);
    fprintf (gp, "set logscale x 2\nset logscale y 10\nset grid\nset key below\n");
    fprintf (gp, "set datafile missing 'NaN'\n");
    //  The x axis in the units people use for value sizes.
    fprintf (gp, "set xtics (");
    for (int p = 0; p < plot->points; p++) {
        double x = plot->x[p];
        const char *unit = x >= 1 << 20 ? "MiB" : x >= 1 << 10 ? "KiB" : "B";
        double scaled = x >= 1 << 20 ? x / (1 << 20) : x >= 1 << 10 ? x / (1 << 10) : x;
        fprintf (gp, "%s\"%g %s\" %.17g", p ? ", " : "", scaled, unit, x);
    }
    fprintf (gp, ")\n");
    fprintf (gp, "plot ");
    for (int s = 0; s < plot->series_count; s++)
        fprintf (gp, "%s'%s/%s.dat' using 1:%d with linespoints lw 2 title \"%s\"",
                 s ? ", \\\n  " : "", dir, plot->name, s + 2, plot->series[s].title);
    for (int r = 0; r < plot->reference_count; r++)
        if (isfinite (plot->references[r].value) && plot->references[r].value > 0)
            fprintf (gp, ", \\\n  %.6g with lines dt 2 lw 2 title \"%s\"",
                     plot->references[r].value, plot->references[r].title);
    fprintf (gp, "\n");
}

int
bench_plot_write (const char *dir, const bench_plot_t *plots, int count, char *why, size_t why_size)
{
    if (access (GNUPLOT, X_OK) != 0) {
        snprintf (why, why_size, "%s: %s (apt-get install gnuplot-nox)", GNUPLOT, strerror (errno));
        return -1;
    }
    char script[4096];
    snprintf (script, sizeof script, "%s/plots.gp", dir);
    FILE *gp = fopen (script, "w");
    if (!gp) {
        snprintf (why, why_size, "cannot write %s: %s", script, strerror (errno));
        return -1;
    }
    fprintf (gp, "# kvpool-bench --plot: redraw with `gnuplot %s`\n", script);
    for (int i = 0; i < count; i++) {
        if (s_write_data (dir, &plots[i]) != 0) {
            snprintf (why, why_size, "cannot write %s/%s.dat: %s", dir, plots[i].name,
                      strerror (errno));
            fclose (gp);
            return -1;
        }
        s_write_script (gp, dir, &plots[i]);
    }
    fclose (gp);
    char log[4096];
    snprintf (log, sizeof log, "%s/gnuplot.log", dir);
    const char *argv[] = {GNUPLOT, script, NULL};
    pid_t pid = bench_spawn (argv, log);
    int status = pid > 0 ? bench_wait (pid) : -1;
    if (status != 0) {
        snprintf (why, why_size, "gnuplot %s exited with %d (see %s)", script, status, log);
        return -1;
    }
    unlink (log);
    return 0;
}
