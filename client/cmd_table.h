/*
 * cmd_table.h - text tables for the gpucmd tool: rows of cells laid out in
 * two passes (fill every cell, then size each column to its widest cell),
 * so exact byte counts and long names stay aligned.  The first column is
 * left-aligned (names), the others right-aligned (numbers) unless
 * table_left says otherwise.
 *
 * The file is named cmd_* because the Makefile links client/cmd_*.c into
 * the tool only; this is not a subcommand and not part of libgpucmd.
 * A table belongs to the thread that made it.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Room for one cell: a 63-byte service name and its NUL fit. */
#define TABLE_CELL 72

struct table {
	size_t ncols;
	char (*cells)[TABLE_CELL]; /* nrows * ncols, row 0 the headings */
	size_t nrows;
	size_t cap;    /* rows allocated */
	int failed;    /* out of memory: rows were dropped */
	uint64_t left; /* bit c: column c is left-aligned */
};

/** A table with the ncols headings as its first row. */
void table_init(struct table *t, size_t ncols, const char *const *headings);
/** Left-align column col (a word, not a number); col < 64. */
void table_left(struct table *t, size_t col);
/** Start a new row; its cells are empty until table_set. */
void table_row(struct table *t);
/** Set cell col of the newest row. */
void table_set(struct table *t, size_t col, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/** Print every row, indented by indent blanks, to f; -1 if rows were lost. */
int table_print(const struct table *t, FILE *f, int indent);
/** Free the cells. */
void table_free(struct table *t);
