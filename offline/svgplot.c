#include "offline/svgplot.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define W 780
#define H 470
#define LEFT 78
#define RIGHT (W - 170)   /* the legend sits right of the plot area */
#define TOP 44
#define BOTTOM (H - 58)

/* one color each for the 14 policies kvp eval knows (kvp_eval_policy_index) */
static const char *const palette[] = {
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
    "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#000000", "#aec7e8",
    "#ffbb78", "#98df8a",
};
#define N_COLORS (int)(sizeof palette / sizeof palette[0])

static void put_escaped(FILE *f, const char *s)
{
    for (; *s; s++)
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
}

static int usable(double y, int log_y)
{
    return isfinite(y) && (!log_y || y > 0.0);
}

/* 1, 2 or 5 times a power of ten, close to range / 5 */
static double nice_step(double range)
{
    double raw = range / 5.0, p = pow(10.0, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1.0 : m < 3.5 ? 2.0 : m < 7.5 ? 5.0 : 10.0) * p;
}

/* the nearest 1, 2 or 5 times a power of ten below (up = 0) or above v > 0 */
static double log_bound(double v, int up)
{
    static const double m[] = {1.0, 2.0, 5.0, 10.0};
    double p = pow(10.0, floor(log10(v) + 1e-9));
    if (!up) {
        int i = 2;
        while (i > 0 && m[i] * p > v * (1 + 1e-9))
            i--;
        return m[i] * p;
    }
    int i = 0;
    while (m[i] * p < v * (1 - 1e-9))
        i++;
    return m[i] * p;
}

static double map_y(const kvp_svg_plot *p, double y, double lo, double hi)
{
    double t = p->log_y ? (log10(y) - log10(lo)) / (log10(hi) - log10(lo)) : (y - lo) / (hi - lo);
    return BOTTOM - t * (BOTTOM - TOP);
}

static double map_x(const kvp_svg_plot *p, double x)
{
    double a = log2(p->x[0]), b = log2(p->x[p->n - 1]);
    /* a single budget sits in the middle */
    double t = b > a ? (log2(x) - a) / (b - a) : 0.5;
    return LEFT + 20 + t * (RIGHT - LEFT - 40);
}

static void marker(FILE *f, int shape, double x, double y, const char *color)
{
    switch (shape % 4) {
    case 0:
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n", x, y, color);
        break;
    case 1:
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"7\" height=\"7\" fill=\"%s\"/>\n",
                x - 3.5, y - 3.5, color);
        break;
    case 2:
        fprintf(f, "<path d=\"M%.1f %.1fL%.1f %.1fL%.1f %.1fZ\" fill=\"%s\"/>\n", x, y - 4.5,
                x + 4.5, y + 3.5, x - 4.5, y + 3.5, color);
        break;
    default:
        fprintf(f, "<path d=\"M%.1f %.1fL%.1f %.1fL%.1f %.1fL%.1f %.1fZ\" fill=\"%s\"/>\n", x,
                y - 4.5, x + 4.5, y, x, y + 4.5, x - 4.5, y, color);
    }
}

static void y_tick(FILE *f, double v, double y)
{
    fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n",
            LEFT, y, RIGHT, y);
    fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#000\"/>\n",
            LEFT - 5, y, LEFT, y);
    fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", LEFT - 8, y + 4, v);
}

int kvp_svg_write(const char *path, const kvp_svg_plot *p, char *err, size_t errlen)
{
    double lo = INFINITY, hi = -INFINITY;
    for (int s = 0; s < p->n_series; s++)
        for (int i = 0; i < p->n; i++)
            if (usable(p->series[s].y[i], p->log_y)) {
                lo = fmin(lo, p->series[s].y[i]);
                hi = fmax(hi, p->series[s].y[i]);
            }
    if (!(lo <= hi)) {
        lo = p->log_y ? 1.0 : 0.0;
        hi = p->log_y ? 10.0 : 1.0;
    }
    double step = 0.0;
    if (p->log_y) {
        lo = log_bound(lo, 0);
        hi = log_bound(hi, 1);
        if (hi <= lo)
            hi = log_bound(lo * 1.01, 1);
    } else {
        if (hi - lo < 1e-12 * fmax(1.0, fabs(hi))) {
            double pad = fabs(hi) > 0 ? fabs(hi) * 0.1 : 1.0;
            lo -= pad;
            hi += pad;
        }
        step = nice_step(hi - lo);
        lo = floor(lo / step + 1e-9) * step;
        hi = ceil(hi / step - 1e-9) * step;
    }

    FILE *f = fopen(path, "w");
    if (!f) {
        snprintf(err, errlen, "cannot create %s: %s", path, strerror(errno));
        return -errno;
    }
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" font-family=\"Helvetica, Arial, sans-serif\" "
               "font-size=\"12\">\n<rect width=\"%d\" height=\"%d\" fill=\"#fff\"/>\n",
            W, H, W, H, W, H);
    fprintf(f, "<text x=\"%d\" y=\"24\" text-anchor=\"middle\" font-size=\"15\" "
               "font-weight=\"bold\">", (LEFT + RIGHT) / 2);
    put_escaped(f, p->title);
    fputs("</text>\n", f);

    /* y grid, ticks and labels */
    if (p->log_y) {
        double decades = log10(hi / lo);
        for (double d = pow(10.0, floor(log10(lo) + 1e-9)); d <= hi * 1.0001; d *= 10.0)
            for (int m = 1; m < 10; m++) {
                double v = d * m;
                int labelled = m == 1 || (decades <= 2.5 && (m == 2 || m == 5)) ||
                               (decades <= 0.7);
                if (v < lo * 0.9999 || v > hi * 1.0001 || (!labelled && decades > 2.5))
                    continue;
                if (labelled)
                    y_tick(f, v, map_y(p, v, lo, hi));
                else
                    fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" "
                               "stroke=\"#f2f2f2\"/>\n", LEFT, map_y(p, v, lo, hi), RIGHT,
                            map_y(p, v, lo, hi));
            }
    } else {
        for (int i = 0; lo + i * step <= hi + step * 1e-6; i++) {
            double v = lo + i * step;
            y_tick(f, fabs(v) < step * 1e-9 ? 0.0 : v, map_y(p, v, lo, hi));
        }
    }
    /* x ticks at every x */
    for (int i = 0; i < p->n; i++) {
        double x = map_x(p, p->x[i]);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#e4e4e4\"/>\n",
                x, TOP, x, BOTTOM);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#000\"/>\n",
                x, BOTTOM, x, BOTTOM + 5);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%g</text>\n", x,
                BOTTOM + 19, p->x[i]);
    }
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
               "stroke=\"#000\"/>\n", LEFT, TOP, RIGHT - LEFT, BOTTOM - TOP);
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">", (LEFT + RIGHT) / 2, H - 14);
    put_escaped(f, p->xlabel);
    fputs("</text>\n", f);
    fprintf(f, "<text transform=\"translate(18 %d) rotate(-90)\" text-anchor=\"middle\">",
            (TOP + BOTTOM) / 2);
    put_escaped(f, p->ylabel);
    fputs("</text>\n", f);

    for (int s = 0; s < p->n_series; s++) {
        const kvp_svg_series *sr = &p->series[s];
        const char *color = palette[sr->color % N_COLORS];
        const char *style = sr->dashed ? " stroke-dasharray=\"6 4\"" : "";
        double width = sr->bold ? 3.0 : 1.6;
        /* a missing value breaks the line (or is skipped: join_gaps) */
        int open = 0;
        for (int i = 0; i < p->n; i++) {
            if (!usable(sr->y[i], p->log_y)) {
                if (open && !p->join_gaps) {
                    fprintf(f, "\" fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\"%s/>\n",
                            color, width, style);
                    open = 0;
                }
                continue;
            }
            fprintf(f, open ? " %.1f,%.1f" : "<polyline points=\"%.1f,%.1f", map_x(p, p->x[i]),
                    map_y(p, sr->y[i], lo, hi));
            open = 1;
        }
        if (open)
            fprintf(f, "\" fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\"%s/>\n", color,
                    width, style);
        for (int i = 0; i < p->n; i++)
            if (usable(sr->y[i], p->log_y))
                marker(f, sr->color, map_x(p, p->x[i]), map_y(p, sr->y[i], lo, hi), color);
        double ly = TOP + 10 + s * 20;
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"%s\" "
                   "stroke-width=\"%.1f\"%s/>\n", RIGHT + 16, ly, RIGHT + 44, ly, color, width,
                style);
        marker(f, sr->color, RIGHT + 30, ly, color);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\"%s>", RIGHT + 52, ly + 4,
                sr->bold ? " font-weight=\"bold\"" : "");
        put_escaped(f, sr->name);
        fputs("</text>\n", f);
    }
    fputs("</svg>\n", f);
    if (ferror(f) | fclose(f)) {
        snprintf(err, errlen, "cannot write %s", path);
        return -EIO;
    }
    return 0;
}
