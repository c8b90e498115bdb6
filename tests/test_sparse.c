/* Block-sparse attention: DeepSpeed's layouts (engine/sparse_layout) counted against its
 * definitions worked by hand (deepspeed/ops/sparse_attention/sparsity_config.py, each mode's
 * set_*_layout), the CPU kernels (kernels/sparse_attn_cpu) against dense attention with the same
 * mask computed independently in double, the pricing of a small case by hand, and every refusal
 * of a bad sparse_attention section (exit 2, the file, the key and what was expected). The CUDA
 * twin against the CPU kernels where there is a GPU. The GPT units' eager block-sparse attention
 * (kernels/sparse_eager_cpu) against the same reference, and the executor training with it:
 * memory against the prediction and a count by hand, and a layout of every block training as
 * dense attention does, to the bit. */
#include <CUnit/CUnit.h>
#include <math.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/sparse_layout.h"
#include "../kernels/ops16_cpu.h"
#include "../kernels/ops_cpu.h"
#include "../kernels/sparse_attn_cpu.h"
#include "../kernels/sparse_eager_cpu.h"
#include "fixtures.h"
#include "run_checks.h"
#include "suites.h"

#ifdef PX_HAVE_CUDA
#include "../kernels/sparse_attn_cuda.h"
#include "../kernels/sparse_eager_cuda.h"
#include "cuda_fixtures.h"
#endif

/* ---- layouts ---- */

/* blocks of row r of head h, and of the whole head */
static long long row_blocks(const SparseAttn *sa, long long h, long long nb, long long r)
{
	uint64_t bits[8];
	return sparse_layout_row(sa, h, nb, r, bits);
}

static long long head_blocks(const SparseAttn *sa, long long h, long long nb)
{
	long long n = 0;
	for (long long r = 0; r < nb; r++)
		n += row_blocks(sa, h, nb, r);
	return n;
}

/* is key block c kept in row r of head h */
static int cell(const SparseAttn *sa, long long h, long long nb, long long r, long long c)
{
	uint64_t bits[8];
	sparse_layout_row(sa, h, nb, r, bits);
	return (int)((bits[c >> 6] >> (c & 63)) & 1);
}

/* fixed, num_local_blocks 4, num_global_blocks 1, nb 16. set_local_layout: row r of window
 * i = 4 floor(r/4) keeps i..r (unidirectional) or i..i+3. set_global_layout (head 0):
 * first_global_block_idx = 4 - (1 + 0) 1 = 3, so columns 3, 7, 11, 15, from row 0
 * (bidirectional) or from the column's own row on (unidirectional).
 * Unidirectional, row r: its window's r%4 + 1 local blocks, plus the global columns of the
 * windows before its own, floor(r/4) (its own window's global column, i+3, is local when r
 * reaches it): sum over r = 4 (1+2+3+4) + 4 (0+1+2+3) = 40 + 24 = 64.
 * Bidirectional: 4 local + 4 global - the one inside its window = 7 a row, 112.
 * With horizontal_global_attention the rows 3, 7, 11, 15 keep all 16: 12 x 7 + 4 x 16 = 148. */
static void test_fixed_counts(void)
{
	SparseAttn sa;
	sparse_attn_defaults(&sa, SPARSE_FIXED);
	sa.unidirectional = 1;
	for (long long r = 0; r < 16; r++)
		CU_ASSERT_EQUAL(row_blocks(&sa, 0, 16, r), r % 4 + 1 + r / 4);
	CU_ASSERT_EQUAL(head_blocks(&sa, 0, 16), 64);
	sa.unidirectional = 0;
	CU_ASSERT_EQUAL(head_blocks(&sa, 0, 16), 112);
	sa.horizontal_global_attention = 1;
	CU_ASSERT_EQUAL(head_blocks(&sa, 0, 16), 148);
	CU_ASSERT_EQUAL(row_blocks(&sa, 0, 16, 7), 16);
	CU_ASSERT_EQUAL(row_blocks(&sa, 0, 16, 8), 7);
}

/* fixed with different_layout_per_head and num_different_global_patterns 4: head h's global column
 * in each window is 3 - h % 4 (first_global_block_idx = 4 - (1 + h % 4)), so row 15 of head 1
 * keeps column 2 and not 3, head 4 repeats head 0. At nb 18 (a trailing partial window 16-17,
 * unidirectional, head 0): end = 16, start = min(16 + 3, 18 - 1) = 17, so row 17 keeps its local
 * 16, 17 and the globals 3, 7, 11, 15 (17 is itself): 6. */
static void test_fixed_patterns(void)
{
	SparseAttn sa;
	sparse_attn_defaults(&sa, SPARSE_FIXED);
	sa.different_layout_per_head = 1;
	sa.num_different_global_patterns = 4;
	CU_ASSERT_TRUE(cell(&sa, 0, 16, 15, 3));
	CU_ASSERT_FALSE(cell(&sa, 1, 16, 15, 3));
	CU_ASSERT_TRUE(cell(&sa, 1, 16, 15, 2));
	CU_ASSERT_TRUE(cell(&sa, 3, 16, 15, 0));
	CU_ASSERT_TRUE(cell(&sa, 4, 16, 15, 3));
	CU_ASSERT_FALSE(cell(&sa, 4, 16, 15, 2));
	sparse_attn_defaults(&sa, SPARSE_FIXED);
	sa.unidirectional = 1;
	CU_ASSERT_EQUAL(row_blocks(&sa, 0, 18, 17), 6);
	CU_ASSERT_EQUAL(row_blocks(&sa, 0, 18, 16), 5); /* 16 and the four globals before it */
	/* 8 heads of one layout at seq 256, block 16: 8 x 64 */
	double n = 0;
	CU_ASSERT_EQUAL(sparse_layout_count(&sa, 8, 256, &n, NULL, NULL), 0);
	CU_ASSERT_EQUAL(n, 512);
}

/* bigbird, nb 16, sliding window 3 (w = 1), 1 global block, no random blocks.
 * Bidirectional: sliding keeps r-1..r+1 (2 on rows 0 and 15, else 3: 46); set_global_layout_itc
 * fills row 0 (16) and column 0 (rows 2..14 add 1 each, row 15 too; row 1 has it):
 * 16 + 3 + 13 x 4 + 3 = 74. Unidirectional: the lower triangle of that: row 0 keeps 1, row 1
 * keeps 0 and 1, rows 2..15 keep r-1, r and 0: 1 + 2 + 14 x 3 = 45. bslongformer with
 * global_block_indices [0] sets the same row and column: the same 74 and 45. */
static void test_bigbird_bslongformer_counts(void)
{
	SparseAttn sa;
	sparse_attn_defaults(&sa, SPARSE_BIGBIRD);
	CU_ASSERT_EQUAL(head_blocks(&sa, 0, 16), 74);
	sa.unidirectional = 1;
	CU_ASSERT_EQUAL(head_blocks(&sa, 0, 16), 45);
	sparse_attn_defaults(&sa, SPARSE_BSLONGFORMER);
	CU_ASSERT_EQUAL(head_blocks(&sa, 0, 16), 74);
	sa.unidirectional = 1;
	CU_ASSERT_EQUAL(head_blocks(&sa, 0, 16), 45);
}

/* random.sample draws k distinct blocks: with k = nb every row is full (256), with k = 2 each
 * bidirectional bigbird row gains 0 to 2 over its 74-layout row, the same for the same head and
 * (different_layout_per_head) not the same for every head. */
static void test_random_blocks(void)
{
	SparseAttn sa, base;
	sparse_attn_defaults(&sa, SPARSE_BIGBIRD);
	base = sa;
	sa.num_random_blocks = 16;
	CU_ASSERT_EQUAL(head_blocks(&sa, 0, 16), 256);
	sa.num_random_blocks = 2;
	sa.different_layout_per_head = 1;
	int differ = 0;
	for (long long r = 0; r < 16; r++) {
		long long n = row_blocks(&sa, 0, 16, r), b = row_blocks(&base, 0, 16, r);
		CU_ASSERT_TRUE(n >= b && n <= b + 2);
		CU_ASSERT_EQUAL(n, row_blocks(&sa, 0, 16, r));
		for (long long c = 0; c < 16; c++)
			differ |= cell(&sa, 0, 16, r, c) != cell(&sa, 1, 16, r, c);
	}
	CU_ASSERT_TRUE(differ);
	/* variable's random blocks are drawn over the whole row even when unidirectional */
	sparse_attn_defaults(&sa, SPARSE_VARIABLE);
	sa.unidirectional = 1;
	sa.num_random_blocks = 16;
	CU_ASSERT_EQUAL(head_blocks(&sa, 0, 16), 256);
}

/* variable, nb 16, global_block_indices [0], no random blocks.
 * local_window_blocks [4], bidirectional: 4 a row (64), column 0 adds rows 4..15 (12): 76;
 * unidirectional: each window's lower triangle 1+2+3+4 = 10, 40, and column 0 from row 0 on adds
 * rows 4..15: 52. local_window_blocks [2, 4] bidirectional: windows 0-1, 2-5, 6-9, 10-13, 14-15
 * (the last size repeats): 2x2 + 3 x 4x4 + 2x2 = 56, column 0 adds rows 2..15: 70.
 * horizontal_global_attention (bidirectional, [4]): row 0 is full: 76 + 12 = 88.
 * global_block_end_indices [2] with indices [0], [4]: columns 0 and 1 for every row outside the
 * first window: 64 + 2 x 12 = 88. dense: 256. */
static void test_variable_dense_counts(void)
{
	SparseAttn sa;
	sparse_attn_defaults(&sa, SPARSE_VARIABLE);
	CU_ASSERT_EQUAL(head_blocks(&sa, 0, 16), 76);
	sa.unidirectional = 1;
	CU_ASSERT_EQUAL(head_blocks(&sa, 0, 16), 52);
	sa.unidirectional = 0;
	sa.local_window_blocks[0] = 2;
	sa.local_window_blocks[1] = 4;
	sa.n_local_windows = 2;
	CU_ASSERT_EQUAL(head_blocks(&sa, 0, 16), 70);
	sparse_attn_defaults(&sa, SPARSE_VARIABLE);
	sa.horizontal_global_attention = 1;
	CU_ASSERT_EQUAL(head_blocks(&sa, 0, 16), 88);
	sparse_attn_defaults(&sa, SPARSE_VARIABLE);
	sa.has_global_end = 1;
	sa.global_block_end_indices[0] = 2;
	CU_ASSERT_EQUAL(head_blocks(&sa, 0, 16), 88);
	sparse_attn_defaults(&sa, SPARSE_DENSE);
	CU_ASSERT_EQUAL(head_blocks(&sa, 0, 16), 256);
}

/* ---- kernels against dense attention under the same mask ---- */

enum { KB = 2, KNH = 3, KT = 64, KHS = 8, KBS = 8, KNB = KT / KBS };

static float *randoms(size_t n, uint64_t *st)
{
	float *x = malloc(n * sizeof(*x));
	for (size_t i = 0; i < n; i++) {
		*st = *st * 6364136223846793005ULL + 1442695040888963407ULL;
		x[i] = (float)((double)(*st >> 11) / 9007199254740992.0 * 2 - 1);
	}
	return x;
}

/* Dense attention in double over the full T x T square with the mask (layout block kept and, if
 * causal, j <= i) applied as -infinity before the softmax, and its textbook backward:
 * dP = dO V^T, dS = P o (dP - rowsum(dP o P)), dQ = s dS K, dK = s dS^T Q, dV = P^T dO. */
static void dense_reference(double *out, double *dq, double *dk, double *dv, const float *q,
			    const float *k, const float *v, const float *dout,
			    const unsigned char *lay, int causal)
{
	static double P[KT][KT], dP[KT][KT];
	double s = 1 / sqrt((double)KHS);
	size_t th = (size_t)KT * KHS;
	memset(dq, 0, sizeof(double) * KB * KNH * th);
	memset(dk, 0, sizeof(double) * KB * KNH * th);
	memset(dv, 0, sizeof(double) * KB * KNH * th);
	for (int b = 0; b < KB; b++)
		for (int h = 0; h < KNH; h++) {
			size_t o = ((size_t)b * KNH + h) * th;
			for (int i = 0; i < KT; i++) {
				double m = -INFINITY, sum = 0;
				for (int j = 0; j < KT; j++) {
					int keep = lay[((size_t)h * KNB + i / KBS) * KNB + j / KBS] &&
						   (!causal || j <= i);
					double x = 0;
					for (int c = 0; c < KHS; c++)
						x += (double)q[o + i * KHS + c] * k[o + j * KHS + c];
					P[i][j] = keep ? x * s : -INFINITY;
					m = fmax(m, P[i][j]);
				}
				for (int j = 0; j < KT; j++)
					sum += (P[i][j] = exp(P[i][j] - m));
				for (int j = 0; j < KT; j++)
					P[i][j] /= sum;
				for (int c = 0; c < KHS; c++) {
					double y = 0;
					for (int j = 0; j < KT; j++)
						y += P[i][j] * v[o + j * KHS + c];
					out[o + i * KHS + c] = y;
				}
			}
			for (int i = 0; i < KT; i++) {
				double rs = 0;
				for (int j = 0; j < KT; j++) {
					double x = 0;
					for (int c = 0; c < KHS; c++)
						x += (double)dout[o + i * KHS + c] * v[o + j * KHS + c];
					dP[i][j] = x;
					rs += x * P[i][j];
				}
				for (int j = 0; j < KT; j++) {
					double ds = P[i][j] * (dP[i][j] - rs);
					for (int c = 0; c < KHS; c++) {
						dq[o + i * KHS + c] += s * ds * k[o + j * KHS + c];
						dk[o + j * KHS + c] += s * ds * q[o + i * KHS + c];
						dv[o + j * KHS + c] += P[i][j] * dout[o + i * KHS + c];
					}
				}
			}
		}
}

/* max |got - want| <= rel max |want| */
static int close_norm(const char *what, const float *got, const double *want, size_t n, double rel)
{
	double worst = 0, top = 0;
	for (size_t i = 0; i < n; i++) {
		worst = fmax(worst, fabs(got[i] - want[i]));
		top = fmax(top, fabs(want[i]));
	}
	if (!(worst <= rel * top))
		printf("\n  %s: max |error| %.3g, max |reference| %.3g (bound %.1g relative)\n", what,
		       worst, top, rel);
	return worst <= rel * top;
}

/* fp32 against double: each output is a softmax-weighted sum over at most 64 keys of 8-term dot
 * products, a few fp32 roundings (2^-24 = 6e-8) per term; the worst seen is 4e-7 of the largest
 * value (dk, dv), so 1e-6 relative. */
#define KERNEL_REL 1e-6

static void check_kernels(const SparseAttn *sa, int causal)
{
	size_t n = (size_t)KB * KNH * KT * KHS;
	uint64_t st = 42 + (uint64_t)sa->mode * 7 + (uint64_t)causal;
	unsigned char *lay = sparse_layout_create(sa, KNH, KNB);
	float *q = randoms(n, &st), *k = randoms(n, &st), *v = randoms(n, &st);
	float *dout = randoms(n, &st), *out = calloc(n, 4), *lse = calloc(n / KHS, 4);
	float *dq = calloc(n, 4), *dk = calloc(n, 4), *dv = calloc(n, 4);
	double *rout = malloc(n * 8), *rdq = malloc(n * 8), *rdk = malloc(n * 8), *rdv = malloc(n * 8);
	CU_ASSERT_PTR_NOT_NULL_FATAL(lay);
	sparse_attn_forward(out, lse, q, k, v, lay, KB, KNH, KT, KHS, KBS, causal);
	sparse_attn_backward(dq, dk, dv, dout, q, k, v, out, lse, lay, KB, KNH, KT, KHS, KBS, causal);
	dense_reference(rout, rdq, rdk, rdv, q, k, v, dout, lay, causal);
	CU_ASSERT_TRUE(close_norm("out", out, rout, n, KERNEL_REL));
	CU_ASSERT_TRUE(close_norm("dq", dq, rdq, n, KERNEL_REL));
	CU_ASSERT_TRUE(close_norm("dk", dk, rdk, n, KERNEL_REL));
	CU_ASSERT_TRUE(close_norm("dv", dv, rdv, n, KERNEL_REL));
	free(lay), free(q), free(k), free(v), free(dout), free(out), free(lse);
	free(dq), free(dk), free(dv), free(rout), free(rdq), free(rdk), free(rdv);
}

static void test_kernels_match_masked_dense(void)
{
	SparseAttn sa;
	sparse_attn_defaults(&sa, SPARSE_FIXED); /* nb 8: two windows of 4 */
	sa.unidirectional = 1;
	check_kernels(&sa, 1);
	sa.unidirectional = 0;
	sa.horizontal_global_attention = 1;
	check_kernels(&sa, 0);
	sparse_attn_defaults(&sa, SPARSE_BIGBIRD);
	sa.num_random_blocks = 2;
	sa.different_layout_per_head = 1; /* each head its own random blocks */
	check_kernels(&sa, 0);
	sparse_attn_defaults(&sa, SPARSE_VARIABLE); /* random blocks above the diagonal, masked */
	sa.num_random_blocks = 1;
	sa.unidirectional = 1;
	check_kernels(&sa, 1);
	sparse_attn_defaults(&sa, SPARSE_BSLONGFORMER);
	check_kernels(&sa, 0);
}

/* The element of a (B, NH, T, hs) array in the units' fused (B, T, 3C) q, k, v (part 0, 1, 2). */
static size_t fused_at(int part, size_t bhtc)
{
	size_t c = bhtc % KHS, t = bhtc / KHS % KT, h = bhtc / KHS / KT % KNH;
	size_t b = bhtc / KHS / KT / KNH, C = (size_t)KNH * KHS;
	return (b * KT + t) * 3 * C + (size_t)part * C + h * KHS + c;
}

/* The units' eager kernel (causal) on the fused layout against the masked dense reference:
 * out, and dq, dk, dv out of dqkv; its probabilities hold each kept block's. Of type t (the 16-bit
 * units' ops16_sparse_attention_*) the inputs and dout are rounded to t first, so that the
 * reference sees what the kernel does, and rel bounds the error. */
static void check_eager_as(const SparseAttn *sa, PrecisionType t, double rel)
{
	size_t n = (size_t)KB * KNH * KT * KHS, C = (size_t)KNH * KHS;
	uint64_t st = 77 + (uint64_t)sa->mode;
	unsigned char *lay = sparse_layout_create(sa, KNH, KNB);
	float *q = randoms(n, &st), *k = randoms(n, &st), *v = randoms(n, &st);
	float *dout = randoms(n, &st);
	float *qkv = malloc(3 * n * 4), *gout = malloc(n * 4), *dqkv = calloc(3 * n, 4);
	float *out = calloc(n, 4), *got = malloc(3 * n * 4);
	double *rout = malloc(n * 8), *rdq = malloc(n * 8), *rdk = malloc(n * 8), *rdv = malloc(n * 8);
	SparseIndex ix;
	CU_ASSERT_FATAL(lay && qkv && gout && dqkv && out && got && rout && rdq && rdk && rdv);
	CU_ASSERT_EQUAL_FATAL(sparse_index_build(&ix, lay, KNH, KNB, KBS), 0);
	size_t np = sparse_eager_probs_elems(&ix, KB);
	float *probs = calloc(np, 4);
	for (size_t i = 0; i < n; i++) {
		q[i] = precision_round(q[i], t), k[i] = precision_round(k[i], t);
		v[i] = precision_round(v[i], t), dout[i] = precision_round(dout[i], t);
		qkv[fused_at(0, i)] = q[i], qkv[fused_at(1, i)] = k[i], qkv[fused_at(2, i)] = v[i];
		size_t tk = i / KHS % KT, h = i / KHS / KT % KNH, b = i / KHS / KT / KNH;
		gout[(b * KT + tk) * C + h * KHS + i % KHS] = dout[i];
	}
	/* of type t: stored in t (fp32 stores as is), run, widened back */
	void *qkv_t = malloc(3 * n * 4), *out_t = malloc(n * 4);
	CU_ASSERT_FATAL(qkv_t && out_t);
	ops16_round(t, qkv_t, qkv, 3 * n);
	ops16_sparse_attention_forward(t, out_t, probs, qkv_t, &ix, KB, KT, (int)C);
	ops16_sparse_attention_backward(t, dqkv, gout, qkv_t, probs, &ix, KB, KT, (int)C);
	ops16_widen(t, out, out_t, n);
	free(qkv_t), free(out_t);
	dense_reference(rout, rdq, rdk, rdv, q, k, v, dout, lay, 1);
	for (size_t i = 0; i < n; i++) {
		size_t tk = i / KHS % KT, h = i / KHS / KT % KNH, b = i / KHS / KT / KNH;
		got[i] = out[(b * KT + tk) * C + h * KHS + i % KHS];
		got[n + i] = dqkv[fused_at(0, i)], got[2 * n + i] = dqkv[fused_at(1, i)];
	}
	CU_ASSERT_TRUE(close_norm("eager out", got, rout, n, rel));
	CU_ASSERT_TRUE(close_norm("eager dq", got + n, rdq, n, rel));
	CU_ASSERT_TRUE(close_norm("eager dk", got + 2 * n, rdk, n, rel));
	for (size_t i = 0; i < n; i++)
		got[i] = dqkv[fused_at(2, i)];
	CU_ASSERT_TRUE(close_norm("eager dv", got, rdv, n, rel));
	sparse_index_free(&ix);
	free(lay), free(q), free(k), free(v), free(dout), free(qkv), free(gout), free(dqkv);
	free(out), free(got), free(probs), free(rout), free(rdq), free(rdk), free(rdv);
}

/* Of a 16-bit type, each output carries a few of t's roundings on its path (the score, its
 * exponential, the probability, the output; backward dP and dS, the rounded dout), each within
 * half its eps (2^-8 bf16, 2^-11 fp16) relatively, mostly cancelling in the sums: 4 eps
 * normwise bounds them (measured: 2 eps in bf16, 1.3 in fp16). */
static void check_eager(const SparseAttn *sa)
{
	check_eager_as(sa, PREC_F32, KERNEL_REL);
	check_eager_as(sa, PREC_BF16, 4 * 0x1p-8);
	check_eager_as(sa, PREC_F16, 4 * 0x1p-11);
}

static void test_eager_matches_masked_dense(void)
{
	SparseAttn sa;
	sparse_attn_defaults(&sa, SPARSE_FIXED);
	sa.unidirectional = 1;
	check_eager(&sa);
	sparse_attn_defaults(&sa, SPARSE_BIGBIRD); /* blocks above the diagonal: all masked */
	sa.num_random_blocks = 2;
	sa.different_layout_per_head = 1;
	check_eager(&sa);
	sparse_attn_defaults(&sa, SPARSE_BSLONGFORMER);
	check_eager(&sa);
}

/* Whether the probabilities of a layout keeping every block (elements of size bytes) are the dense
 * op's (B, NH, T, T) att, bit for bit: probability (b, h, i, j) sits in kept block (h, i / bs,
 * j / bs), row i % bs. */
static int probs_are_dense(const SparseIndex *ix, const void *probs, const void *att, size_t size)
{
	int same = 1;
	for (int b = 0; b < KB; b++)
		for (int h = 0; h < KNH; h++)
			for (int i = 0; i < KT; i++)
				for (int j = 0; j < KT; j++) {
					size_t blk = ((size_t)h * KNB + i / KBS) * KNB + j / KBS;
					size_t at = (((size_t)b * ix->n_kept + blk) * KBS + i % KBS) * KBS +
						    j % KBS;
					size_t dn = (((size_t)b * KNH + h) * KT + i) * KT + j;
					same &= memcmp((const char *)probs + size * at,
						       (const char *)att + size * dn, size) == 0;
				}
	return same;
}

/* Every block kept: the dense units' op, ops_attention_forward / backward, to the bit (the same
 * keys in the same order), its T x T probabilities the kept blocks' laid out by rows. */
static void test_eager_dense_layout_is_dense(void)
{
	enum { C = KNH * KHS };
	size_t n = (size_t)KB * KT * C;
	uint64_t st = 5;
	unsigned char *lay = malloc((size_t)KNH * KNB * KNB);
	float *qkv = randoms(3 * n, &st), *dout = randoms(n, &st);
	float *o1 = calloc(n, 4), *o2 = calloc(n, 4), *d1 = calloc(3 * n, 4), *d2 = calloc(3 * n, 4);
	float *att = calloc((size_t)KB * KNH * KT * KT, 4);
	SparseIndex ix;
	CU_ASSERT_FATAL(lay && o1 && o2 && d1 && d2 && att);
	memset(lay, 1, (size_t)KNH * KNB * KNB);
	CU_ASSERT_EQUAL_FATAL(sparse_index_build(&ix, lay, KNH, KNB, KBS), 0);
	CU_ASSERT_EQUAL(ix.n_kept, KNH * KNB * KNB);
	float *probs = calloc(sparse_eager_probs_elems(&ix, KB), 4);
	ops_attention_forward(o1, att, qkv, KB, KT, C, KNH);
	ops_attention_backward(d1, dout, qkv, att, KB, KT, C, KNH);
	sparse_eager_forward(o2, probs, qkv, &ix, KB, KT, C);
	sparse_eager_backward(d2, dout, qkv, probs, &ix, KB, KT, C);
	CU_ASSERT(memcmp(o1, o2, n * 4) == 0);
	CU_ASSERT(memcmp(d1, d2, 3 * n * 4) == 0);
	CU_ASSERT(probs_are_dense(&ix, probs, att, 4));
	sparse_index_free(&ix);
	free(lay), free(qkv), free(dout), free(o1), free(o2), free(d1), free(d2), free(att), free(probs);
}

/* Every block kept, in bf16 and fp16: the forward is the 16-bit dense op's to the bit (its
 * probabilities too, laid out by rows as above), rounding where it rounds, summing in its order.
 * The backward sums each query row's dq and dk as the fp32 sparse op does (the dense 16-bit op
 * sums over keys per element first) and pdp in double (the dense op in float), which can move a
 * rounded dS by one unit of t's last place: within 4 eps of the dense op's gradients normwise, as
 * above (measured: 2e-5 eps in bf16, 2e-3 in fp16). */
static void test_eager16_dense_layout(void)
{
	enum { C = KNH * KHS };
	size_t n = (size_t)KB * KT * C, tt = (size_t)KB * KNH * KT * KT;
	static const PrecisionType types[2] = {PREC_BF16, PREC_F16};
	for (int k = 0; k < 2; k++) {
		PrecisionType t = types[k];
		double eps = t == PREC_BF16 ? 0x1p-8 : 0x1p-11;
		uint64_t st = 9;
		unsigned char *lay = malloc((size_t)KNH * KNB * KNB);
		float *qkv = randoms(3 * n, &st), *dout = randoms(n, &st);
		void *q16 = malloc(3 * n * 2), *o1 = calloc(n, 2), *o2 = calloc(n, 2);
		void *att = calloc(tt, 2);
		float *d1 = calloc(3 * n, 4), *d2 = calloc(3 * n, 4);
		SparseIndex ix;
		CU_ASSERT_FATAL(lay && q16 && o1 && o2 && att && d1 && d2);
		memset(lay, 1, (size_t)KNH * KNB * KNB);
		CU_ASSERT_EQUAL_FATAL(sparse_index_build(&ix, lay, KNH, KNB, KBS), 0);
		void *probs = calloc(sparse_eager_probs_elems(&ix, KB), 2);
		ops16_round(t, q16, qkv, 3 * n);
		ops16_attention_forward(t, o1, att, q16, KB, KT, C, KNH);
		ops16_attention_backward(t, d1, dout, q16, att, KB, KT, C, KNH);
		ops16_sparse_attention_forward(t, o2, probs, q16, &ix, KB, KT, C);
		ops16_sparse_attention_backward(t, d2, dout, q16, probs, &ix, KB, KT, C);
		CU_ASSERT(memcmp(o1, o2, n * 2) == 0);
		CU_ASSERT(probs_are_dense(&ix, probs, att, 2));
		double worst = 0, top = 0;
		for (size_t i = 0; i < 3 * n; i++) {
			worst = fmax(worst, fabs((double)d1[i] - d2[i]));
			top = fmax(top, fabs((double)d1[i]));
		}
		if (!(worst <= 4 * eps * top))
			printf("\n  16-bit sparse backward: %.3g of %.3g (%.2g eps)\n", worst, top,
			       worst / top / eps);
		CU_ASSERT(top > 0 && worst <= 4 * eps * top);
		sparse_index_free(&ix);
		free(lay), free(qkv), free(dout), free(q16), free(o1), free(o2), free(att), free(d1);
		free(d2), free(probs);
	}
}

/* ---- the executor (scenarios/gpt2-mini-cpu-sparse.json) ---- */

/* Its fixed layout (16-token blocks over 128 tokens: nb 8, windows of 4, one global block,
 * unidirectional), by sparsity_config.py's FixedSparsityConfig: each window's rows keep the
 * window's blocks up to the diagonal, 1 + 2 + 3 + 4 = 10, and the second window's four rows also
 * the first window's last block, global: 10 + 10 + 4 = 24 blocks a head, 96 over 4 heads. A block
 * keeps 4 B T (16 C) bytes of activations and its probabilities, 4 B 96 x 16^2 (B 4, T 128, C
 * 128): 4 x (1,048,576 + 98,304) = 4,587,520 B; 4 blocks 18,350,080 B, against 20,971,520 with
 * dense scores. In bf16 the 16-bit units keep the same elements in 2 bytes, probabilities too:
 * 9,175,040 B. Measured equal to the prediction (every memory and communication pair, 2 ranks)
 * and to this count. Under selective recompute the probabilities are a buffer of their own
 * (98,304 floats a block, rebuilt before its backward), which no block keeps after its forward:
 * every memory and communication pair equal to the prediction again, and the activations'
 * measured peak below the run's without recompute. */
static void test_run_memory(void)
{
	double peak[2][2]; /* [selective][bf16]: rank 0's activations at their own peak */
	for (int k = 0; k < 4; k++) {
		int bf16 = k % 2, sel = k / 2;
		char args[2048];
		snprintf(args, sizeof(args), "run '%s' --ranks 2 --steps 3 --set "
			 "deepspeed.bf16.enabled=%s%s",
			 px_test_path("scenarios/gpt2-mini-cpu-sparse.json"), bf16 ? "true" : "false",
			 sel ? " --set activation_checkpointing=selective" : "");
		sqlite3 *db = px_run_measured(args, 2);
		for (int r = 0; !sel && r < 2; r++)
			CU_ASSERT_EQUAL(px_run_metric(db, "memory.gpu.activations_bytes", "measured",
						      r), bf16 ? 9175040 : 18350080);
		peak[sel][bf16] = px_run_metric(db, "memory.gpu.peak.activations_bytes", "measured",
						0);
		sqlite3_close(db);
	}
	for (int bf16 = 0; bf16 < 2; bf16++)
		CU_ASSERT(peak[1][bf16] < peak[0][bf16]);
}

/* Mode "dense" keeps every block: the run's losses are those of the same run without
 * sparse_attention, to the bit (the units' arithmetic is the dense op's); the fixed layout's run
 * learns (its last loss under 0.9 of its first). */
static void test_run_losses(void)
{
	enum { S = 6 };
	char base[1024];
	double dense[S], all[S], fixed[S];
	snprintf(base, sizeof(base), "run '%s' --no-db --json",
		 px_test_path("scenarios/gpt2-mini-cpu-sparse.json"));
	CU_ASSERT_EQUAL_FATAL(px_run_losses(base, 2, S, "--set deepspeed.sparse_attention.mode=dense",
					    all), S);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(base, 2, S, "--set deepspeed.sparse_attention=null", dense),
			      S);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(base, 2, S, "", fixed), S);
	for (int s = 0; s < S; s++)
		CU_ASSERT_EQUAL(all[s], dense[s]);
	CU_ASSERT(fixed[S - 1] < 0.9 * fixed[0]);
	CU_ASSERT(fixed[S - 1] != dense[S - 1]);

	/* bf16: the first loss to the bit (the 16-bit forward is the dense op's); the backward's
	 * sums in another order then move the losses by bf16's reordering of sums, as elsewhere
	 * (tests/test_exec.c: 5e-3 nats) */
	const char *b16 = "--set deepspeed.bf16.enabled=true";
	char with[256];
	snprintf(with, sizeof(with), "%s --set deepspeed.sparse_attention.mode=dense", b16);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(base, 2, S, with, all), S);
	snprintf(with, sizeof(with), "%s --set deepspeed.sparse_attention=null", b16);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(base, 2, S, with, dense), S);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(base, 2, S, b16, fixed), S);
	CU_ASSERT_EQUAL(all[0], dense[0]);
	for (int s = 0; s < S; s++)
		CU_ASSERT_DOUBLE_EQUAL(all[s], dense[s], 5e-3);
	CU_ASSERT(fixed[S - 1] < 0.9 * fixed[0]);

	/* selective recompute rebuilds the kept blocks' probabilities with the forward's own
	 * arithmetic: the fixed layout's losses to the bit, in fp32 and in bf16 */
	for (int d = 0; d < 2; d++) {
		snprintf(with, sizeof(with), "%s --set activation_checkpointing=selective",
			 d ? b16 : "");
		CU_ASSERT_EQUAL_FATAL(px_run_losses(base, 2, S, d ? b16 : "", fixed), S);
		CU_ASSERT_EQUAL_FATAL(px_run_losses(base, 2, S, with, all), S);
		for (int s = 0; s < S; s++)
			CU_ASSERT_EQUAL(all[s], fixed[s]);
	}
}

/* Under tensor parallelism each rank attends over its heads' kept blocks (kernels/gpt_tp_cpu's
 * units on an index of its 2 heads; the fixed layout is the same for every head, 24 blocks
 * each): the fp32 losses within 1e-6 of one rank's (the tp suite's bound, for its reasons), the
 * first to the bit, alone, with selective recompute, with sequence parallelism, and beside
 * ZeRO-1 over dp 2; every memory and communication pair equals the prediction, a rank's
 * activations at the peak its 4 blocks' 4 (B T (4 C + 12 C / 2) + B 48 x 16^2) bytes each,
 * 4 x (655,360 + 49,152) = 2,818,048 at B 4, T 128, C 128, and the head's (the stream and the
 * final norm's output, (B T, C) each, and its half of the probabilities, (B T, V / 2), fp32):
 * 4 x 2,818,048 + 4 x (2 x 65,536 + 65,536) = 12,058,624 bytes. */
static void test_run_tp(void)
{
	static const PxRunCase runs[] = {
		{2, "--set parallelism.tp=2"},
		{2, "--set parallelism.tp=2 --set activation_checkpointing=selective"},
		{2, "--set parallelism.tp=2 --set parallelism.sequence_parallel=true"},
		{4, "--set parallelism.tp=2 --set deepspeed.zero_optimization.stage=1"},
	};
	char base[1024];
	double ref[PX_LOSS_STEPS];
	snprintf(base, sizeof(base), "run '%s' --no-db --json",
		 px_test_path("scenarios/gpt2-mini-cpu-sparse.json"));
	px_check_losses(base, runs, (int)(sizeof(runs) / sizeof(runs[0])), 1e-6, 1, ref);
	char args[1024];
	snprintf(args, sizeof(args), "run '%s' --ranks 2 --steps 2 --set parallelism.tp=2",
		 px_test_path("scenarios/gpt2-mini-cpu-sparse.json"));
	sqlite3 *db = px_run_measured(args, 2);
	for (int r = 0; r < 2; r++)
		CU_ASSERT_EQUAL(px_run_metric(db, "memory.gpu.activations_bytes", "measured", r),
				12058624);
	sqlite3_close(db);
}

/* MoE blocks (scenarios/gpt2-mini-cpu-moe.json, ep 2, 64 tokens) over a fixed layout of 16-token
 * blocks, 2 of them a window: kernels/moe_cpu's attention takes the index as the dense blocks'
 * does. A layout keeping every block ("dense") trains as the model without sparse_attention, to
 * the bit; the fixed layout's losses equal under selective recompute (to the bit) and at tp 2
 * (within 1e-6: the tp suite's reassociations); every memory and communication pair equals the
 * prediction, in fp32 and bf16. */
static void test_run_moe(void)
{
	static const char *const FIXED = "--set 'deepspeed.sparse_attention={\"mode\": \"fixed\", "
		"\"block\": 16, \"num_local_blocks\": 2, \"num_global_blocks\": 1, "
		"\"attention\": \"unidirectional\"}'";
	enum { S = 4 };
	const char *moe = px_test_path("scenarios/gpt2-mini-cpu-moe.json");
	char base[1024], extra[512];
	double plain[S], all[S], fixed[S], got[S];
	snprintf(base, sizeof(base), "run '%s' --no-db --json", moe);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(base, 2, S, "", plain), S);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(base, 2, S, "--set 'deepspeed.sparse_attention={"
					    "\"mode\": \"dense\", \"block\": 16}'", all), S);
	CU_ASSERT(!memcmp(plain, all, sizeof(plain)));
	CU_ASSERT_EQUAL_FATAL(px_run_losses(base, 2, S, FIXED, fixed), S);
	CU_ASSERT(fixed[S - 1] != plain[S - 1]);
	snprintf(extra, sizeof(extra), "%s --set activation_checkpointing=selective", FIXED);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(base, 2, S, extra, got), S);
	CU_ASSERT(!memcmp(fixed, got, sizeof(got)));
	snprintf(extra, sizeof(extra), "%s --set parallelism.tp=2", FIXED);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(base, 4, S, extra, got), S);
	CU_ASSERT(px_worst_rel(fixed, got, S) <= 1e-6);
	for (int bf16 = 0; bf16 < 2; bf16++) {
		char args[1024];
		snprintf(args, sizeof(args), "run '%s' --ranks 2 --steps 2 %s --set "
			 "deepspeed.bf16.enabled=%s", moe, FIXED, bf16 ? "true" : "false");
		sqlite3_close(px_run_measured(args, 2));
	}
}

/* What the executor does not run with sparse attention is refused before it starts (exit 2),
 * naming what it runs: under tensor parallelism a layout whose kept blocks fall unevenly on the
 * ranks' heads (bigbird's random blocks drawn per head: 44 and 47 of 91 on 2 ranks). */
static void test_run_refuses(void)
{
	char out[8192];
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "run '%s' --no-db --ranks 2 --set "
					 "parallelism.tp=2 --set deepspeed.sparse_attention.mode=bigbird "
					 "--set deepspeed.sparse_attention.different_layout_per_head=true "
					 "--set deepspeed.sparse_attention.num_random_blocks=1",
					 px_test_path("scenarios/gpt2-mini-cpu-sparse.json")), 2);
	PX_ASSERT_HAS(out, "gpt2-mini-cpu-sparse.json: the executor runs deepspeed.sparse_attention "
		      "under tensor parallelism with a layout whose kept blocks spread evenly");
	CU_ASSERT_PTR_NULL(strstr(out, "step    1"));
	/* the CUDA units run it in fp32 only: bf16 refused before any device is looked for */
	CU_ASSERT_EQUAL(px_test_run_clif(out, sizeof(out), "run '%s' --no-db --backend cuda --set "
					 "deepspeed.bf16.enabled=true",
					 px_test_path("scenarios/gpt2-mini-cpu-sparse.json")), 2);
	PX_ASSERT_HAS(out, "the executor runs deepspeed.sparse_attention on backend \"cpu\", or "
		      "\"cuda\" in fp32");
}

/* The backward accumulates (+=): run twice into the same gradients, get twice the gradients. */
static void test_kernel_backward_accumulates(void)
{
	SparseAttn sa;
	sparse_attn_defaults(&sa, SPARSE_FIXED);
	size_t n = (size_t)KB * KNH * KT * KHS;
	uint64_t st = 7;
	unsigned char *lay = sparse_layout_create(&sa, KNH, KNB);
	float *q = randoms(n, &st), *k = randoms(n, &st), *v = randoms(n, &st);
	float *dout = randoms(n, &st), *out = calloc(n, 4), *lse = calloc(n / KHS, 4);
	float *d1 = calloc(n, 4), *d2 = calloc(n, 4), *x1 = calloc(n, 4), *x2 = calloc(n, 4);
	sparse_attn_forward(out, lse, q, k, v, lay, KB, KNH, KT, KHS, KBS, 0);
	sparse_attn_backward(d1, x1, x1, dout, q, k, v, out, lse, lay, KB, KNH, KT, KHS, KBS, 0);
	sparse_attn_backward(d2, x2, x2, dout, q, k, v, out, lse, lay, KB, KNH, KT, KHS, KBS, 0);
	sparse_attn_backward(d2, x2, x2, dout, q, k, v, out, lse, lay, KB, KNH, KT, KHS, KBS, 0);
	/* each term is added to what is there, so the second pass rounds differently: to 1e-6 */
	double worst = 0, top = 0;
	for (size_t i = 0; i < n; i++) {
		worst = fmax(worst, fabs(d2[i] - 2.0 * d1[i]));
		top = fmax(top, fabs(2.0 * d1[i]));
	}
	CU_ASSERT_TRUE(top > 0 && worst <= 1e-6 * top);
	free(lay), free(q), free(k), free(v), free(dout), free(out), free(lse);
	free(d1), free(d2), free(x1), free(x2);
}

/* ---- pricing by hand ---- */

/* GPT-2 shaped: h 64, 4 heads (d 16), 2 blocks, seq 256, micro-batch 2, bf16, one GPU; fixed,
 * unidirectional, block 16: nb 16, 64 blocks a head (test_fixed_counts).
 * Attention FLOPs of a block: QK^T over the blocks, 2 x 16 (rows) x 16 (d) x 16 (keys) a block,
 * x 64 blocks x 4 heads x 2 sequences = 4,194,304; AV the same: 8,388,608 (dense: 2 x 2 x 256 x
 * 16 x 256 x 8 = 33,554,432).
 * Kept scores: 64 x 16^2 = 16,384 a head (of 65,536), x 4 heads x 2 sequences = 131,072, each
 * softmax output 2 bytes, dropout mask 1, dropout output 2 (attn_pdrop 0.1): 655,360 bytes
 * (dense: 4 x 655,360 = 2,621,440). */
#define SMALL_GPT "{\"model\": {\"model_type\": \"gpt2\", \"n_embd\": 64, \"n_layer\": 2, " \
		  "\"n_head\": 4, \"n_positions\": 1024, \"vocab_size\": 1000}, " \
		  "\"deepspeed\": {\"train_micro_batch_size_per_gpu\": 2, " \
		  "\"gradient_accumulation_steps\": 1, \"bf16\": {\"enabled\": true}%s}, " \
		  "\"cluster\": {\"gpu\": \"A100-80GB\", \"nodes\": 1, \"gpus_per_node\": 1}, " \
		  "\"seq_length\": 256%s}"
#define FIXED_UNI ", \"sparse_attention\": {\"mode\": \"fixed\", \"attention\": \"unidirectional\"}"

static void test_pricing_by_hand(void)
{
	Scenario sc;
	Prediction pr;
	if (fx_predictf(&sc, &pr, SMALL_GPT, FIXED_UNI, ""))
		return;
	const UnitPlan *u = &pr.plan.units[1];
	CU_ASSERT_DOUBLE_EQUAL(sc.sparse_blocks, 64, 0);
	CU_ASSERT_DOUBLE_EQUAL(u->attn_flops, 8388608, 0);
	CU_ASSERT_DOUBLE_EQUAL(u->score_bytes, 655360, 0);
	double sparse_fwd = u->fwd_flops;
	fx_free(&sc, &pr);
	if (fx_predictf(&sc, &pr, SMALL_GPT, "", ""))
		return;
	u = &pr.plan.units[1];
	CU_ASSERT_DOUBLE_EQUAL(u->attn_flops, 33554432, 0);
	CU_ASSERT_DOUBLE_EQUAL(u->score_bytes, 2621440, 0);
	/* the rest of the block is the same: only the attention products changed */
	CU_ASSERT_DOUBLE_EQUAL(u->fwd_flops - sparse_fwd, 33554432 - 8388608, 0);
	fx_free(&sc, &pr);
}

/* ---- refusals ---- */

static char cli_out[1 << 14];

/* a scenario file of SMALL_GPT with the deepspeed extra and top-level extra; its path */
static const char *write_scenario(const char *ds_extra, const char *top_extra)
{
	static char path[1024];
	char text[4096];
	snprintf(path, sizeof(path), "%s/sparse.json", px_test_tmpdir());
	snprintf(text, sizeof(text), SMALL_GPT, ds_extra, top_extra);
	px_test_write_file(path, text);
	return path;
}

static void expect_refusal(const char *ds_extra, const char *top_extra, const char *msg)
{
	int rc = px_test_run_clif(cli_out, sizeof(cli_out), "predict --no-db '%s'",
				  write_scenario(ds_extra, top_extra));
	CU_ASSERT_EQUAL(rc, 2);
	PX_ASSERT_HAS(cli_out, "sparse.json:1:");
	PX_ASSERT_HAS(cli_out, msg);
}

#define SA(body) ", \"sparse_attention\": {" body "}"

static void test_refusals(void)
{
	expect_refusal(SA("\"mode\": \"strided\""), "",
		       "deepspeed.sparse_attention.mode: expected one of dense, fixed, variable, "
		       "bigbird, bslongformer, got \"strided\"");
	expect_refusal(SA("\"num_local_blocks\": 4, \"num_global_blocks\": 3"), "",
		       "deepspeed.sparse_attention.num_global_blocks: must divide num_local_blocks "
		       "4, got 3");
	expect_refusal(SA("\"attention\": \"unidirectional\", \"horizontal_global_attention\": true"),
		       "", "deepspeed.sparse_attention.horizontal_global_attention: needs attention "
		       "\"bidirectional\"");
	expect_refusal(SA("\"num_different_global_patterns\": 2"), "",
		       "num_different_global_patterns: must be 1 unless different_layout_per_head "
		       "is true, got 2");
	expect_refusal(SA("\"different_layout_per_head\": true, \"num_different_global_patterns\": 5"),
		       "", "num_different_global_patterns: must be at most num_local_blocks / "
		       "num_global_blocks = 4, got 5");
	expect_refusal(SA("\"attention\": \"forward\""), "",
		       "sparse_attention.attention: expected one of bidirectional, unidirectional");
	expect_refusal(SA("\"mode\": \"bslongformer\", \"global_block_indices\": [0, 4], "
			  "\"global_block_end_indices\": [2]"), "",
		       "global_block_end_indices: expected as many entries as global_block_indices "
		       "(2), got 1");
	expect_refusal(SA("\"mode\": \"variable\", \"global_block_indices\": [3], "
			  "\"global_block_end_indices\": [3]"), "",
		       "global_block_end_indices: each end must be above its start");
	expect_refusal(SA("\"mode\": \"variable\", \"local_window_blocks\": []"), "",
		       "local_window_blocks: expected a list of 1 to 64 integers of at least 1");
	expect_refusal(SA("\"mode\": \"bigbird\", \"attention\": \"unidirectional\", "
			  "\"num_random_blocks\": 2"), "",
		       "num_random_blocks: must be at most 1 with attention \"unidirectional\"");
	expect_refusal(SA("\"block\": 48"), "",
		       "deepspeed.sparse_attention.block: must divide the sequence length 256, got "
		       "48");
	expect_refusal(SA("\"mode\": \"bigbird\", \"num_sliding_window_blocks\": 17"), "",
		       "num_sliding_window_blocks: must be at most the 16 blocks of a row, got 17");
	expect_refusal(SA("\"mode\": \"fixed\""), ", \"attention\": \"flash\"",
		       "deepspeed.sparse_attention replaces the attention kernel");
}

/* A key the mode does not read is warned about, as DeepSpeed ignores it, and the prediction runs. */
static void test_unread_key_warned(void)
{
	int rc = px_test_run_clif(cli_out, sizeof(cli_out), "predict --no-db '%s'",
				  write_scenario(SA("\"mode\": \"bigbird\", \"num_local_blocks\": 8"),
						 ""));
	CU_ASSERT_EQUAL(rc, 0);
	PX_ASSERT_HAS(cli_out, "deepspeed.sparse_attention.num_local_blocks has no effect in mode "
			   "\"bigbird\"");
}

/* The report names the layout and its share of the scores: fixed, unidirectional, block 16 at
 * seq 256 keeps 64 of 16 x 16 blocks a head (test_fixed_counts), 0.25. */
static void test_report_header(void)
{
	int rc = px_test_run_clif(cli_out, sizeof(cli_out), "predict --no-db '%s'",
				  write_scenario(FIXED_UNI, ""));
	CU_ASSERT_EQUAL(rc, 0);
	PX_ASSERT_HAS(cli_out, "attention block-sparse (DeepSpeed's sparse_attention)");
	PX_ASSERT_HAS(cli_out, "# sparse     fixed, unidirectional, block 16: 64 of 256 blocks per "
			       "head kept (0.25 of the s^2 scores)");
}

/* On an encoder-decoder (DeepSpeed applies the section where a model's code builds its
 * SparseSelfAttention; T5's does not) the section is listed as not modelled and attention is
 * priced dense: the same prediction as without it. */
static void test_encoder_decoder_noted(void)
{
	char path[1024], text[2048];
	snprintf(path, sizeof(path), "%s/t5.json", px_test_tmpdir());
	snprintf(text, sizeof(text), "{%s, \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 1, "
		 "\"gradient_accumulation_steps\": 1%s}, \"cluster\": {\"gpu\": \"A100-80GB\", "
		 "\"nodes\": 1, \"gpus_per_node\": 1}, \"seq_length\": 512}",
		 fx_model("flan-t5-base"), SA("\"mode\": \"fixed\""));
	px_test_write_file(path, text);
	int rc = px_test_run_clif(cli_out, sizeof(cli_out), "predict --no-db '%s'", path);
	CU_ASSERT_EQUAL(rc, 0);
	PX_ASSERT_HAS(cli_out, "deepspeed.sparse_attention (on an encoder-decoder: attention priced "
			       "dense)");
}

/* ---- the CUDA twin ---- */

#ifdef PX_HAVE_CUDA
/* Against the CPU kernels on the same data: forward and dq to 1e-6 of the largest value (the same
 * operations in the same order, up to the compiler's fused multiply-adds), dk and dv to 1e-6 too
 * (atomics sum them in another order). */
static void test_cuda_matches_cpu(void)
{
	SparseAttn sa;
	sparse_attn_defaults(&sa, SPARSE_BIGBIRD);
	sa.num_random_blocks = 1;
	size_t n = (size_t)KB * KNH * KT * KHS, nl = (size_t)KNH * KNB * KNB;
	uint64_t st = 99;
	unsigned char *lay = sparse_layout_create(&sa, KNH, KNB);
	float *q = randoms(n, &st), *k = randoms(n, &st), *v = randoms(n, &st);
	float *dout = randoms(n, &st), *out = calloc(n, 4), *lse = calloc(n / KHS, 4);
	float *dq = calloc(n, 4), *dk = calloc(n, 4), *dv = calloc(n, 4);
	sparse_attn_forward(out, lse, q, k, v, lay, KB, KNH, KT, KHS, KBS, 1);
	sparse_attn_backward(dq, dk, dv, dout, q, k, v, out, lse, lay, KB, KNH, KT, KHS, KBS, 1);
	CudaCtx *ctx = cfx_ctx();
	float *gq = cfx_up(q, n), *gk = cfx_up(k, n), *gv = cfx_up(v, n), *gdo = cfx_up(dout, n);
	float *gout = cfx_put(NULL, n * 4), *glse = cfx_put(NULL, n / KHS * 4);
	float *gdq = cfx_put(NULL, n * 4), *gdk = cfx_put(NULL, n * 4), *gdv = cfx_put(NULL, n * 4);
	unsigned char *glay = cfx_put(lay, nl);
	sparse_attn_cuda_forward(ctx, gout, glse, gq, gk, gv, glay, KB, KNH, KT, KHS, KBS, 1);
	sparse_attn_cuda_backward(ctx, gdq, gdk, gdv, gdo, gq, gk, gv, gout, glse, glay, KB, KNH, KT,
				  KHS, KBS, 1);
	float *hout = cfx_down(gout, n), *hdq = cfx_down(gdq, n), *hdk = cfx_down(gdk, n);
	float *hdv = cfx_down(gdv, n);
	CU_ASSERT_EQUAL(cfx_close_norm("out", hout, out, n, 1e-6), 0);
	CU_ASSERT_EQUAL(cfx_close_norm("dq", hdq, dq, n, 1e-6), 0);
	CU_ASSERT_EQUAL(cfx_close_norm("dk", hdk, dk, n, 1e-6), 0);
	CU_ASSERT_EQUAL(cfx_close_norm("dv", hdv, dv, n, 1e-6), 0);
	void *dev[] = {gq, gk, gv, gdo, gout, glse, gdq, gdk, gdv, glay};
	for (int i = 0; i < 10; i++)
		cuda_ctx_free(dev[i]);
	free(lay), free(q), free(k), free(v), free(dout), free(out), free(lse);
	free(dq), free(dk), free(dv), free(hout), free(hdq), free(hdk), free(hdv);
}

/* The GPT units' eager kernel on the GPU (kernels/sparse_eager_cuda.cu) against the CPU's
 * (sparse_eager_cpu.c), on fused q, k, v under bigbird's per-head random layout, unidirectional:
 * the output and the kept probabilities as the CPU computes them (the same sums, in the same
 * order: within 1e-6 normwise), the gradients within 1e-5 (the GPU sums the key and value
 * gradients with atomics, in another order). Written without a GPU (2026-11-30). */
static void test_cuda_eager_matches_cpu(void)
{
	SparseAttn sa;
	sparse_attn_defaults(&sa, SPARSE_BIGBIRD);
	sa.num_random_blocks = 1;
	sa.different_layout_per_head = 1;
	int C = KNH * KHS;
	size_t n3 = (size_t)KB * KT * 3 * C, n = (size_t)KB * KT * C;
	uint64_t st = 5;
	unsigned char *lay = sparse_layout_create(&sa, KNH, KNB);
	SparseIndex ix;
	CU_ASSERT_EQUAL_FATAL(sparse_index_build(&ix, lay, KNH, KNB, KBS), 0);
	size_t np = sparse_eager_probs_elems(&ix, KB);
	float *qkv = randoms(n3, &st), *dout = randoms(n, &st), *out = calloc(n, 4);
	float *probs = calloc(np, 4), *dqkv = calloc(n3, 4);
	sparse_eager_forward(out, probs, qkv, &ix, KB, KT, C);
	sparse_eager_backward(dqkv, dout, qkv, probs, &ix, KB, KT, C);
	CudaCtx *ctx = cfx_ctx();
	SparseIndexDev dix;
	CU_ASSERT_EQUAL_FATAL(sparse_eager_cuda_upload(&dix, &ix), 0);
	float *gqkv = cfx_up(qkv, n3), *gdout = cfx_up(dout, n), *gout = cfx_put(NULL, n * 4);
	float *gprobs = cfx_put(NULL, np * 4), *gdqkv = cfx_put(NULL, n3 * 4);
	cuda_ctx_zero(ctx, gdqkv, n3 * 4);
	sparse_eager_cuda_forward(ctx, gout, gprobs, gqkv, &dix, KB, KT, C);
	sparse_eager_cuda_backward(ctx, gdqkv, gdout, gqkv, gprobs, &dix, KB, KT, C);
	float *hout = cfx_down(gout, n), *hprobs = cfx_down(gprobs, np), *hdqkv = cfx_down(gdqkv, n3);
	CU_ASSERT_EQUAL(cfx_close_norm("eager out", hout, out, n, 1e-6), 0);
	CU_ASSERT_EQUAL(cfx_close_norm("eager probs", hprobs, probs, np, 1e-6), 0);
	CU_ASSERT_EQUAL(cfx_close_norm("eager dqkv", hdqkv, dqkv, n3, 1e-5), 0);
	void *dev[] = {gqkv, gdout, gout, gprobs, gdqkv};
	for (int i = 0; i < 5; i++)
		cuda_ctx_free(dev[i]);
	sparse_eager_cuda_free(&dix);
	sparse_index_free(&ix);
	free(lay), free(qkv), free(dout), free(out), free(probs), free(dqkv);
	free(hout), free(hprobs), free(hdqkv);
}
#endif

int test_sparse_register(void)
{
	static const PxTestCase cpu[] = {
		{"fixed: counts per row by hand", test_fixed_counts},
		{"fixed: global patterns per head, trailing window", test_fixed_patterns},
		{"bigbird and bslongformer counts by hand", test_bigbird_bslongformer_counts},
		{"random blocks: distinct, seeded, per head", test_random_blocks},
		{"variable and dense counts by hand", test_variable_dense_counts},
		{"kernels equal masked dense attention, fwd and bwd", test_kernels_match_masked_dense},
		{"kernel backward accumulates", test_kernel_backward_accumulates},
		{"units' eager kernel equals masked dense, fwd and bwd", test_eager_matches_masked_dense},
		{"units' eager kernel, every block kept: the dense op", test_eager_dense_layout_is_dense},
		{"units' eager kernel in bf16 and fp16, every block kept: the 16-bit dense op",
		 test_eager16_dense_layout},
		{"run: activations measured equal predicted and by hand", test_run_memory, PX_RELEASE_RUN},
		{"run: a layout of every block trains as dense", test_run_losses, PX_RELEASE_RUN},
		{"run: tensor parallelism over the ranks' heads' blocks", test_run_tp, PX_RELEASE_RUN},
		{"run: MoE blocks over the layout", test_run_moe, PX_RELEASE_RUN},
		{"run: what the executor does not run refused", test_run_refuses},
		{"FLOPs and kept scores of a small case by hand", test_pricing_by_hand},
		{"bad sparse_attention refused (exit 2, file, key)", test_refusals},
		{"a key the mode does not read is warned about", test_unread_key_warned},
		{"an encoder-decoder: noted, priced dense", test_encoder_decoder_noted},
		{"the report names the layout", test_report_header},
	};
#ifdef PX_HAVE_CUDA
	static const PxTestCase gpu[] = {
		{"CUDA twin equals the CPU kernels", test_cuda_matches_cpu},
		{"the units' eager kernel on the GPU equals the CPU's", test_cuda_eager_matches_cpu},
	};
	return cfx_register("sparse", "test_sparse", cpu, (int)(sizeof(cpu) / sizeof(cpu[0])), gpu,
			    2);
#else
	printf("test_sparse: CUDA twin not tested: built without CUDA (no nvcc under CUDA_HOME)\n");
	return px_add_suite("sparse", cpu, (int)(sizeof(cpu) / sizeof(cpu[0])));
#endif
}
