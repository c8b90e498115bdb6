/* llmc_files: writes the inputs llm.c's CPU trainer (train_gpt2.c) reads, for the side-by-side
 * speed comparison in scripts/bench_llmc.sh: a GPT-2 124M checkpoint with random weights
 * (gpt2_124M.bin) and train/val token files (dev/data/tinyshakespeare/tiny_shakespeare_*.bin),
 * under a directory given on the command line. Only speed is compared, so the weights are GPT-2's
 * init drawn from our own generator, not trained ones, and the tokens are uniform over the
 * vocabulary. It owns nothing else; llm.c itself is built outside this repository.
 *
 * The file layouts, read from llm.c's train_gpt2.c and llmc/dataloader.h as facts:
 *   checkpoint: 256 int32 header {20240326, 3, maxT, V, L, NH, C, Vp, 0...}, then fp32 parameters
 *               in the order wte (Vp, C), wpe (maxT, C), ln1w (L, C), ln1b (L, C),
 *               qkvw (L, 3C, C), qkvb (L, 3C), attprojw (L, C, C), attprojb (L, C), ln2w (L, C),
 *               ln2b (L, C), fcw (L, 4C, C), fcb (L, 4C), fcprojw (L, C, 4C), fcprojb (L, C),
 *               lnfw (C), lnfb (C).
 *   tokens:     256 int32 header {20240520, 1, ntok, 0...}, then ntok uint16 token ids.
 *
 * A file that exists already is left as it is (it may be a real checkpoint or data set), and said;
 * each file is written under a temporary name and renamed when complete, so a failed run leaves
 * no partial file for the next run to take as done.
 *
 * Build and run: cc -O2 -o llmc_files scripts/llmc_files.c -lm && ./llmc_files DIR */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* GPT-2 124M: maxT = context, V = vocabulary, Vp = V padded to a multiple of 128 (llm.c's),
 * L = blocks, NH = heads, C = channels */
enum { MAX_T = 1024, V = 50257, VP = 50304, L = 12, NH = 12, C = 768 };
enum { HEADER_INTS = 256, CKPT_MAGIC = 20240326, CKPT_VERSION = 3 };
enum { TOKENS_MAGIC = 20240520, TOKENS_VERSION = 1 };
enum { TRAIN_TOKENS = 1 << 16, VAL_TOKENS = 1 << 14 };
#define INIT_STD 0.02 /* GPT-2's initializer_range */

/* ---- random numbers: splitmix64, and normals by Box-Muller ---- */

static uint64_t rng_state = 0x5eed1234u;

static uint64_t rng_next(void)
{
	uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

/* uniform in (0, 1]: never 0, so log() below is finite */
static double rng_unit(void)
{
	return ((rng_next() >> 11) + 1) * (1.0 / 9007199254740992.0);
}

static double rng_normal(void)
{
	return sqrt(-2.0 * log(rng_unit())) * cos(6.283185307179586 * rng_unit());
}

/* ---- writing ---- */

static char tmp_path[4200]; /* the file being written, removed on failure */

static void fail(const char *what, const char *path)
{
	fprintf(stderr, "llmc_files: %s %s: %s\n", what, path, strerror(errno));
	if (tmp_path[0])
		remove(tmp_path);
	exit(1);
}

/* path's temporary twin, opened for writing */
static FILE *open_tmp(const char *path)
{
	snprintf(tmp_path, sizeof(tmp_path), "%s.tmp", path);
	FILE *f = fopen(tmp_path, "wb");
	if (!f)
		fail("cannot create", tmp_path);
	return f;
}

/* closes f and gives the temporary its final name */
static void commit(FILE *f, const char *path)
{
	if (fclose(f))
		fail("cannot write", tmp_path);
	if (rename(tmp_path, path))
		fail("cannot rename to", path);
	tmp_path[0] = '\0';
}

static void put(const void *p, size_t size, size_t n, FILE *f)
{
	if (fwrite(p, size, n, f) != n)
		fail("cannot write", tmp_path);
}

/* n values: normal(0, std) when std > 0, else the constant value */
static void put_tensor(FILE *f, size_t n, double std, float value)
{
	float buf[4096];
	while (n) {
		size_t k = n < 4096 ? n : 4096;
		for (size_t i = 0; i < k; i++)
			buf[i] = std > 0 ? (float)(std * rng_normal()) : value;
		put(buf, sizeof(float), k, f);
		n -= k;
	}
}

/* 1, said, when path exists: it is not ours to replace */
static int exists(const char *path)
{
	struct stat st;
	if (stat(path, &st))
		return 0;
	fprintf(stderr, "llmc_files: %s exists; left as it is\n", path);
	return 1;
}

static void write_checkpoint(const char *path)
{
	if (exists(path))
		return;
	FILE *f = open_tmp(path);
	int32_t h[HEADER_INTS] = {CKPT_MAGIC, CKPT_VERSION, MAX_T, V, L, NH, C, VP};
	put(h, sizeof(h[0]), HEADER_INTS, f);
	size_t c = C, l = L;
	double resid_std = INIT_STD / sqrt(2.0 * L); /* GPT-2's scaled residual projections */
	put_tensor(f, (size_t)V * c, INIT_STD, 0);     /* wte: the vocabulary's rows... */
	put_tensor(f, (size_t)(VP - V) * c, 0, 0.0f); /* ...and the padding rows, 0 */
	put_tensor(f, (size_t)MAX_T * c, INIT_STD, 0); /* wpe */
	put_tensor(f, l * c, 0, 1.0f);                 /* ln1w */
	put_tensor(f, l * c, 0, 0.0f);                 /* ln1b */
	put_tensor(f, l * 3 * c * c, INIT_STD, 0);     /* qkvw */
	put_tensor(f, l * 3 * c, 0, 0.0f);             /* qkvb */
	put_tensor(f, l * c * c, resid_std, 0);        /* attprojw */
	put_tensor(f, l * c, 0, 0.0f);                 /* attprojb */
	put_tensor(f, l * c, 0, 1.0f);                 /* ln2w */
	put_tensor(f, l * c, 0, 0.0f);                 /* ln2b */
	put_tensor(f, l * 4 * c * c, INIT_STD, 0);     /* fcw */
	put_tensor(f, l * 4 * c, 0, 0.0f);             /* fcb */
	put_tensor(f, l * c * 4 * c, resid_std, 0);    /* fcprojw */
	put_tensor(f, l * c, 0, 0.0f);                 /* fcprojb */
	put_tensor(f, c, 0, 1.0f);                     /* lnfw */
	put_tensor(f, c, 0, 0.0f);                     /* lnfb */
	commit(f, path);
}

static void write_tokens(const char *path, int ntok)
{
	if (exists(path))
		return;
	FILE *f = open_tmp(path);
	int32_t h[HEADER_INTS] = {TOKENS_MAGIC, TOKENS_VERSION, ntok};
	put(h, sizeof(h[0]), HEADER_INTS, f);
	for (int i = 0; i < ntok; i++) {
		uint16_t t = (uint16_t)(rng_next() % V);
		put(&t, sizeof(t), 1, f);
	}
	commit(f, path);
}

static void make_dir(const char *path)
{
	if (mkdir(path, 0755) && errno != EEXIST)
		fail("cannot create the directory", path);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: llmc_files DIR\n"
				"writes DIR/gpt2_124M.bin and DIR/dev/data/tinyshakespeare/"
				"tiny_shakespeare_{train,val}.bin in llm.c's formats\n");
		return 2;
	}
	char path[4096];
	const char *dir = argv[1];
	snprintf(path, sizeof(path), "%s/gpt2_124M.bin", dir);
	write_checkpoint(path);
	const char *sub[] = {"/dev", "/dev/data", "/dev/data/tinyshakespeare"};
	for (int i = 0; i < 3; i++) {
		snprintf(path, sizeof(path), "%s%s", dir, sub[i]);
		make_dir(path);
	}
	snprintf(path, sizeof(path), "%s/dev/data/tinyshakespeare/tiny_shakespeare_train.bin", dir);
	write_tokens(path, TRAIN_TOKENS);
	snprintf(path, sizeof(path), "%s/dev/data/tinyshakespeare/tiny_shakespeare_val.bin", dir);
	write_tokens(path, VAL_TOKENS);
	return 0;
}
