/* fsdp_wrap: which of a block's parameters PyTorch FSDP's auto-wrap policies put in a unit of
 * their own, and which they leave to an enclosing one. It walks the block's modules as
 * model_unit_tensors names them ("attn.q.weight": module attn.q inside attn) the way torch's
 * _recursive_wrap does (torch/distributed/fsdp/wrap.py); it does not decide how the units are
 * gathered or reduced (engine/build_fsdp.c) nor read the scenario. */
#ifndef PX_FSDP_WRAP_H
#define PX_FSDP_WRAP_H

#include "model.h"

typedef struct FsdpWrap {
	long long wrapped;  /* whole-model elements of the block in units inside or at the block */
	long long leftover; /* the rest: left to the enclosing unit (the model's, or the root) */
	int pieces;         /* how many units hold the wrapped ones: 0, 1 (the block, or one of its
			       modules) or more (several of its modules, each gathered alone) */
} FsdpWrap;

/* size_based_auto_wrap_policy(min_num_params) on block unit `unit` (1..L): children first, then a
 * module whose parameters not yet wrapped number min_num_params or more becomes a unit, a
 * ModuleList (the routed experts' list) never does, while each expert in it may. Returns -1 when
 * the block has more tensors than model_unit_tensors gives (never for a known model). */
int fsdp_wrap_size_based(const ModelSpec *m, int unit, double min_num_params, FsdpWrap *out);

#endif
