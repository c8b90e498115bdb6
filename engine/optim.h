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

/* Elements of a 1-bit optimizer's compressed buffer for elems elements over n ranks: elems rounded
 * up to a multiple of n lcm(n, 8) (onebit/adam.py corrected_tensor_size). */
long long optim_onebit_padded_elems(long long elems, long long n);

#endif
