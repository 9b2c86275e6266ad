/*
 * cmd_table.c - text tables for the gpucmd tool.  See cmd_table.h.
 *
 * Running out of memory while filling a table is remembered instead of
 * returned from every call, so the code that fills a table reads as a
 * list of cells; table_print says whether the table is whole.
 */
#include "cmd_table.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void table_init(struct table *t, size_t ncols, const char *const *headings)
{
	memset(t, 0, sizeof(*t));
	t->ncols = ncols;
	t->left = 1;
	table_row(t);
	for (size_t c = 0; c < ncols; c++)
		table_set(t, c, "%s", headings[c]);
}

void table_left(struct table *t, size_t col)
{
	if (col < 64)
		t->left |= (uint64_t)1 << col;
}

void table_row(struct table *t)
{
	if (t->failed)
		return;
	if (t->nrows == t->cap) {
		size_t cap = t->cap ? 2 * t->cap : 8;
		char(*cells)[TABLE_CELL] =
			realloc(t->cells, cap * t->ncols * sizeof(*cells));

		if (cells == NULL) {
			t->failed = 1;
			return;
		}
		t->cells = cells;
		t->cap = cap;
	}
	memset(t->cells[t->nrows * t->ncols], 0, t->ncols * sizeof(*t->cells));
	t->nrows++;
}

void table_set(struct table *t, size_t col, const char *fmt, ...)
{
	va_list ap;

	if (t->failed || t->nrows == 0 || col >= t->ncols)
		return;
	va_start(ap, fmt);
	vsnprintf(t->cells[(t->nrows - 1) * t->ncols + col], TABLE_CELL, fmt,
		  ap);
	va_end(ap);
}

int table_print(const struct table *t, FILE *f, int indent)
{
	int *width = calloc(t->ncols ? t->ncols : 1, sizeof(*width));

	if (width == NULL || t->failed) {
		free(width);
		return -1;
	}
	for (size_t r = 0; r < t->nrows; r++)
		for (size_t c = 0; c < t->ncols; c++) {
			int w = (int)strlen(t->cells[r * t->ncols + c]);

			if (w > width[c])
				width[c] = w;
		}
	for (size_t r = 0; r < t->nrows; r++) {
		const char(*row)[TABLE_CELL] = &t->cells[r * t->ncols];

		fprintf(f, "%*s", indent, "");
		for (size_t c = 0; c < t->ncols; c++) {
			int left = c < 64 && (t->left >> c & 1);
			/* No blanks after the last cell of a line. */
			int w = left && c + 1 == t->ncols ? 0 : width[c];

			fprintf(f, "%s%*s", c > 0 ? "  " : "", left ? -w : w,
				row[c]);
		}
		fputc('\n', f);
	}
	free(width);
	return 0;
}

void table_free(struct table *t)
{
	free(t->cells);
	memset(t, 0, sizeof(*t));
}
