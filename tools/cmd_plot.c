/* kvp plot: one SVG line plot from a CSV of measured points, for results gathered over
 * several `kvp eval` runs (scripts/eval-quality-per-byte.sh). Every series may be
 * measured at its own x; the x axis (log2) has a tick at every x of any series. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/parse.h"
#include "offline/svgplot.h"
#include "tools/cli.h"

#define MAX_SERIES 16
#define MAX_X 64

static void usage(FILE *f)
{
    fprintf(f,
        "usage: kvp plot --csv FILE --out FILE.svg [options]\n"
        "  --csv FILE         lines 'protocol,series,budget,x,y' after a header line\n"
        "  --protocol P       plot only the lines of protocol P (default: every line)\n"
        "  --title T, --xlabel X, --ylabel Y\n"
        "  --log-y            log10 y axis\n"
        "At most %d series and %d distinct x values; x > 0.\n", MAX_SERIES, MAX_X);
}

typedef struct point {
    char series[64];
    double x, y;
} point;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Reads the points of `protocol` (NULL: all); -1 with a message on a bad line. */
static int read_points(const char *path, const char *protocol, point **out, int *n_out)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "kvp plot: cannot read %s: %s\n", path, strerror(errno));
        return -1;
    }
    char line[512];
    int n = 0, cap = 0, lineno = 0, rc = 0;
    point *pts = NULL;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        size_t len = strlen(line);
        if (len && line[len - 1] == '\n')
            line[--len] = '\0';
        if (lineno == 1 || !len)
            continue;   /* the header */
        char *field[6];
        int nf = 0;
        for (char *save, *t = strtok_r(line, ",", &save); t && nf < 6; t = strtok_r(NULL, ",", &save))
            field[nf++] = t;
        double x, y;
        if (nf != 5 || strlen(field[1]) >= sizeof pts->series || !kvp_parse_double(field[3], 1e-300, 1e300, &x) ||
            !(kvp_parse_double(field[4], -1e300, 1e300, &y))) {
            fprintf(stderr, "kvp plot: %s:%d: expected 'protocol,series,budget,x,y' with x > 0\n",
                    path, lineno);
            rc = -1;
            break;
        }
        if (protocol && strcmp(field[0], protocol))
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            point *p = realloc(pts, (size_t)cap * sizeof *p);
            if (!p) {
                fprintf(stderr, "kvp plot: out of memory\n");
                rc = -1;
                break;
            }
            pts = p;
        }
        snprintf(pts[n].series, sizeof pts[n].series, "%s", field[1]);
        pts[n].x = x;
        pts[n].y = y;
        n++;
    }
    fclose(f);
    if (!rc && !n) {
        fprintf(stderr, "kvp plot: no points%s%s in %s\n", protocol ? " of protocol " : "",
                protocol ? protocol : "", path);
        rc = -1;
    }
    if (rc) {
        free(pts);
        return rc;
    }
    *out = pts;
    *n_out = n;
    return 0;
}

int kvp_cmd_plot(int argc, char **argv)
{
    const char *csv = NULL, *out = NULL, *protocol = NULL, *title = "", *xlabel = "x", *ylabel = "y";
    int log_y = 0;
    static const struct option opts[] = {
        {"csv", 1, 0, 'c'}, {"out", 1, 0, 'o'}, {"protocol", 1, 0, 'p'}, {"title", 1, 0, 't'},
        {"xlabel", 1, 0, 'x'}, {"ylabel", 1, 0, 'y'}, {"log-y", 0, 0, 'l'}, {"help", 0, 0, 'h'},
        {0, 0, 0, 0}};
    int o, idx = 0;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, &idx)) != -1) {
        switch (o) {
        case 'c': csv = optarg; break;
        case 'o': out = optarg; break;
        case 'p': protocol = optarg; break;
        case 't': title = optarg; break;
        case 'x': xlabel = optarg; break;
        case 'y': ylabel = optarg; break;
        case 'l': log_y = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!csv || !out || optind < argc) {
        fprintf(stderr, "kvp plot: %s\n", optind < argc ? "unexpected argument" : "--csv and --out are required");
        return 2;
    }
    point *pts;
    int n;
    if (read_points(csv, protocol, &pts, &n))
        return 1;
    /* the series in order of appearance, the x values sorted and unique */
    const char *names[MAX_SERIES];
    double xs[MAX_X], ys[MAX_SERIES][MAX_X];
    int n_series = 0, n_x = 0, status = 1;
    for (int i = 0; i < n; i++) {
        int s = 0, j = 0;
        while (s < n_series && strcmp(names[s], pts[i].series))
            s++;
        while (j < n_x && xs[j] != pts[i].x)
            j++;
        if ((s == n_series && n_series == MAX_SERIES) || (j == n_x && n_x == MAX_X)) {
            fprintf(stderr, "kvp plot: more than %d series or %d x values\n", MAX_SERIES, MAX_X);
            goto done;
        }
        if (s == n_series)
            names[n_series++] = pts[i].series;
        if (j == n_x)
            xs[n_x++] = pts[i].x;
    }
    qsort(xs, (size_t)n_x, sizeof *xs, cmp_double);
    kvp_svg_series series[MAX_SERIES];
    for (int s = 0; s < n_series; s++) {
        for (int j = 0; j < n_x; j++)
            ys[s][j] = NAN;
        series[s] = (kvp_svg_series){names[s], ys[s], s, 0, 0};
    }
    for (int i = 0; i < n; i++) {
        int s = 0, j = 0;
        while (strcmp(names[s], pts[i].series))
            s++;
        while (xs[j] != pts[i].x)
            j++;
        ys[s][j] = pts[i].y;
    }
    kvp_svg_plot plot = {title, xlabel, ylabel, xs, n_x, log_y, series, n_series, 1};
    char err[256];
    if (kvp_svg_write(out, &plot, err, sizeof err)) {
        fprintf(stderr, "kvp plot: %s\n", err);
        goto done;
    }
    status = 0;
done:
    free(pts);
    return status;
}
