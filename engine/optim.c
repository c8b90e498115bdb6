#include "optim.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* deepspeed/runtime/config.py DEEPSPEED_OPTIMIZERS (lower-cased before matching) and the classes
 * engine.py _configure_basic_optimizer builds for them; any other type is getattr(torch.optim,
 * type). States are the tensors each class keeps in self.state per parameter:
 * FusedAdam/CPUAdam exp_avg, exp_avg_sq; FusedLamb the same; torch Adagrad and CPUAdagrad sum;
 * FusedLion/CPULion exp_avg; OnebitAdam exp_avg, exp_avg_sq (+ worker_error, server_error);
 * ZeroOneAdam those and momentum_accumulator; OnebitLamb exp_avg, exp_avg_sq, exp_avg_sq_fresh
 * (+ one flat worker and server error); mup's MuAdam(W) Adam's two, MuSGD SGD's momentum;
 * MuonWithAuxAdam momentum_buffer on its Muon parameters and exp_avg, exp_avg_sq on the rest.
 * torch.optim: Adadelta square_avg, acc_delta; Adamax exp_avg, exp_inf; ASGD ax; NAdam and RAdam
 * exp_avg, exp_avg_sq; RMSprop square_avg (+ momentum_buffer, + grad_avg when centered); Rprop
 * prev, step_size; SGD momentum_buffer when momentum > 0. ZeRO's tested list is
 * runtime/zero/utils.py ZERO_SUPPORTED_OPTIMIZERS (Adam, AdamW, Adagrad, Lion, Muon). */
static const OptimKind KINDS[] = {
	/* name, torch, states, +momentum, +centered, error feedback, muon, zero tested, no ZeRO */
	{"Adam", 0, 2, 0, 0, EF_NONE, 0, 1, NULL},
	{"AdamW", 0, 2, 0, 0, EF_NONE, 0, 1, NULL},
	{"Lamb", 0, 2, 0, 0, EF_NONE, 0, 0, NULL},
	{"OneBitAdam", 0, 2, 0, 0, EF_PER_TENSOR, 0, 0, "1bit-Adam is not compatible with ZeRO"},
	{"ZeroOneAdam", 0, 3, 0, 0, EF_PER_TENSOR, 0, 0, "0/1 Adam is not compatible with ZeRO"},
	{"OneBitLamb", 0, 3, 0, 0, EF_FLAT, 0, 0, "1bit-Lamb is not compatible with ZeRO"},
	{"Adagrad", 0, 1, 0, 0, EF_NONE, 0, 1, NULL},
	{"Lion", 0, 1, 0, 0, EF_NONE, 0, 1, NULL},
	{"MuAdam", 0, 2, 0, 0, EF_NONE, 0, 0, NULL},
	{"MuAdamW", 0, 2, 0, 0, EF_NONE, 0, 0, NULL},
	{"MuSGD", 0, 0, 1, 0, EF_NONE, 0, 0, NULL},
	{"Muon", 0, 2, 0, 0, EF_NONE, 1, 1, NULL},
	{"SGD", 1, 0, 1, 0, EF_NONE, 0, 0, NULL},
	{"Adadelta", 1, 2, 0, 0, EF_NONE, 0, 0, NULL},
	{"Adamax", 1, 2, 0, 0, EF_NONE, 0, 0, NULL},
	{"ASGD", 1, 1, 0, 0, EF_NONE, 0, 0, NULL},
	{"NAdam", 1, 2, 0, 0, EF_NONE, 0, 0, NULL},
	{"RAdam", 1, 2, 0, 0, EF_NONE, 0, 0, NULL},
	{"RMSprop", 1, 1, 1, 1, EF_NONE, 0, 0, NULL},
	{"Rprop", 1, 2, 0, 0, EF_NONE, 0, 0, NULL},
	{0},
};

const OptimKind *optim_find(const char *type, const char **hint)
{
	*hint = NULL;
	for (const OptimKind *k = KINDS; k->name; k++) {
		if (k->from_torch ? !strcmp(k->name, type) : !strcasecmp(k->name, type))
			return k;
		if (k->from_torch && !strcasecmp(k->name, type))
			*hint = k->name;
	}
	return NULL;
}

int optim_zero_one(const OptimKind *k)
{
	return k && !strcmp(k->name, "ZeroOneAdam");
}

void optim_names(char *buf, size_t size)
{
	size_t n = 0;
	buf[0] = 0;
	for (const OptimKind *k = KINDS; k->name && n < size; k++)
		n += (size_t)snprintf(buf + n, size - n, "%s%s", n ? ", " : "", k->name);
}

/* ---- implementations ---- */

/* What each update allocates (the L2 weight decay's copy of the gradients in torch's Adam, not
 * AdamW, is freed before the square root in torch >= 2.1, so it never adds to it), and the traffic
 * of its separate passes: torch's AdamW runs eight over fp32 elements (the decay's mul_ 8 bytes,
 * lerp_ 12, mul_ 8, addcmul_ 12, sqrt 8, div_ 8, add_ 8, addcdiv_ 16: 80 bytes), the for-loop the
 * same per tensor, transformers' AdamW about as many (mul_, add_, mul_, addcmul_, sqrt, add_,
 * addcdiv_, the decay's add_): 52 bytes an element over the fused pass's 28. */
static const OptimImpl IMPLS[] = {
	[OPT_IMPL_FUSED] = {"fused", 0, 0, 0,
			    "DeepSpeed FusedAdam/CPUAdam, torch fused=True and apex FusedAdam update "
			    "in place (multi_tensor_apply)"},
	[OPT_IMPL_FOREACH] = {"torch foreach", 1, 1, 52,
			      "torch/optim/adam.py _multi_tensor_adam: exp_avg_sq_sqrt = "
			      "torch._foreach_sqrt(device_exp_avg_sqs), over the whole group "
			      "(torch >= 2.1; foreach is torch's default on CUDA since pytorch#95415)"},
	[OPT_IMPL_FOR_LOOP] = {"torch for-loop", 0, 2, 52,
			       "torch/optim/adam.py _single_tensor_adam: denom = (exp_avg_sq.sqrt() "
			       "/ bias_correction2_sqrt), two temporaries of one tensor's size"},
	[OPT_IMPL_HF] = {"transformers AdamW", 0, 1, 52,
			 "transformers.optimization.AdamW.step: denom = exp_avg_sq.sqrt()"
			 ".add_(eps), one temporary of one tensor's size"},
};

const OptimImpl *optim_impl(OptimImplKind k)
{
	return &IMPLS[k];
}

/* transformers' OptimizerNames for AdamW: adamw_hf was the Trainer's default until
 * huggingface/transformers#25109 (July 2023), adamw_torch after it, adamw_torch_fused with
 * torch >= 2.8 since huggingface/transformers#37358 (July 2025) */
const char *const optim_trainer_names[] = {"adamw_hf", "adamw_torch", "adamw_torch_fused",
					   "adamw_apex_fused", NULL};

int optim_impl_from_trainer(const char *optim, OptimImplKind *out)
{
	static const OptimImplKind kinds[] = {OPT_IMPL_HF, OPT_IMPL_FOREACH, OPT_IMPL_FUSED,
					      OPT_IMPL_FUSED};
	for (int i = 0; optim_trainer_names[i]; i++)
		if (!strcmp(optim, optim_trainer_names[i])) {
			*out = kinds[i];
			return 0;
		}
	return -1;
}

/* ---- 1-bit padding ---- */

static long long gcd_ll(long long a, long long b)
{
	while (b) {
		long long t = a % b;
		a = b;
		b = t;
	}
	return a;
}

long long optim_onebit_padded_elems(long long elems, long long n)
{
	long long unit = n * (n * 8 / gcd_ll(n, 8)); /* size * divider, divider = lcm(size, 8) */
	return (elems + unit - 1) / unit * unit;
}
