/* optim: the optimizer types a DeepSpeed config can name, as deepspeed/runtime/engine.py builds
 * them: DeepSpeed's own (matched without regard to case) and torch.optim's (by exact name), the
 * state each keeps per parameter, the 1-bit optimizers' error-feedback buffers and the ZeRO stages
 * DeepSpeed allows with each. It does not read the config (dsconfig.c) or place the bytes (plan.c). */
#ifndef PX_OPTIM_H
#define PX_OPTIM_H

#include <stddef.h>

/* Error feedback of the 1-bit optimizers (deepspeed/runtime/fp16/onebit/): a worker error as large
 * as the compressed momentum and a server error of 1/N of it, N the data-parallel ranks, both fp32
 * and padded to a multiple of N lcm(N, 8). */
typedef enum {
	EF_NONE,
	EF_PER_TENSOR, /* OneBitAdam, ZeroOneAdam: one pair per parameter tensor */
	EF_FLAT,       /* OneBitLamb: one pair for the flat of all momenta */
} ErrorFeedback;

typedef struct OptimKind {
	const char *name;     /* as written in DeepSpeed's docs or torch.optim */
	int from_torch;       /* not DeepSpeed's own: taken from torch.optim by exact name */
	int states;           /* fp32 tensors per parameter besides the master copy */
	int momentum_state;   /* one more when params.momentum > 0 (SGD's momentum buffer) */
	int centered_state;   /* one more when params.centered is true (RMSprop's grad_avg) */
	ErrorFeedback error_feedback;
	int muon;             /* Muon: hidden matrices keep one momentum, the rest Adam's two */
	int zero_tested;      /* in ZeRO's tested list (runtime/zero/utils.py): others need
				 zero_allow_untested_optimizer with ZeRO */
	const char *no_zero;  /* DeepSpeed's assertion when it refuses ZeRO (stage >= 1), or NULL */
} OptimKind;

/* The kind named type, or NULL. A torch.optim name written in another case ("sgd") is not found,
 * as in DeepSpeed; *hint then names the right spelling (else NULL). */
const OptimKind *optim_find(const char *type, const char **hint);
/* Whether k is DeepSpeed's ZeroOneAdam (0/1 Adam: local steps, a momentum accumulator). */
int optim_zero_one(const OptimKind *k);
/* "Adam, AdamW, ..." for messages, into buf. */
void optim_names(char *buf, size_t size);

/* How an Adam-type update is carried out, which decides what it allocates while it runs: the
 * step's transient tensors, beside the states it keeps (docs/models.md, "the optimizer step").
 * DeepSpeed's own optimizers (FusedAdam, CPUAdam, FusedLamb, ...), torch's fused=True and apex's
 * FusedAdam update every tensor in place chunk by chunk (multi_tensor_apply) and hold nothing. */
typedef enum {
	OPT_IMPL_FUSED,    /* nothing held */
	OPT_IMPL_FOREACH,  /* torch.optim foreach: one fp32 copy of the whole group's second moment */
	OPT_IMPL_FOR_LOOP, /* torch.optim foreach=False: two copies of one tensor's, at once */
	OPT_IMPL_HF,       /* transformers' own AdamW (optim adamw_hf): one copy of one tensor's */
} OptimImplKind;

typedef struct OptimImpl {
	const char *name;  /* as printed and stored */
	int whole_group;   /* the copies span every tensor the optimizer holds, else one at a time */
	int copies;        /* fp32 copies of that many elements alive at once */
	int extra_bytes;   /* memory traffic an element beyond the fused update's one pass (28
			      bytes: p, g, m, v read, p, m, v written, fp32) */
	const char *source;
} OptimImpl;

const OptimImpl *optim_impl(OptimImplKind k);
/* The Trainer's optim name (TrainingArguments.optim) as an implementation: 0, or -1 when it is not
 * one of the AdamW names the table knows (optim_trainer_names lists them). */
int optim_impl_from_trainer(const char *optim, OptimImplKind *out);
extern const char *const optim_trainer_names[]; /* NULL-terminated */

/* Elements of a 1-bit optimizer's compressed buffer for elems elements over n ranks: elems rounded
 * up to a multiple of n lcm(n, 8) (onebit/adam.py corrected_tensor_size). */
long long optim_onebit_padded_elems(long long elems, long long n);

#endif
