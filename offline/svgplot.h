/* A small SVG line-plot writer for evaluation results: axes with ticks, one polyline
 * with markers per series, a legend. Standalone SVG 1.1 that browsers and rsvg show. */
#ifndef KVP_SVGPLOT_H
#define KVP_SVGPLOT_H

#include <stddef.h>

typedef struct kvp_svg_series {
    const char *name;
    const double *y;   /* [n] values at x; NaN (or <= 0 on a log axis) = no point */
    int color;         /* palette index */
    int dashed;        /* drawn dashed (reference lines) */
    int bold;          /* drawn thicker (the method under test) */
} kvp_svg_series;

typedef struct kvp_svg_plot {
    const char *title, *xlabel, *ylabel;
    const double *x;   /* [n] > 0, increasing; placed on a log2 axis, ticks at each x */
    int n;
    int log_y;         /* log10 y axis instead of linear */
    const kvp_svg_series *series;
    int n_series;
    int join_gaps;     /* a missing value is skipped, not a break in the line (series
                        * measured at different x on one shared axis) */
} kvp_svg_plot;

/* Writes the plot to path. 0, or -errno with a message. */
int kvp_svg_write(const char *path, const kvp_svg_plot *p, char *err, size_t errlen);

#endif
