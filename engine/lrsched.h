/* lrsched: the learning-rate schedule of a DeepSpeed config (its "scheduler" section): DeepSpeed's
 * WarmupLR and WarmupDecayLR as runtime/lr_schedules.py computes them, and their "auto" values
 * as transformers' Trainer fills them from TrainingArguments. Other schedulers are read as
 * not modelled. It owns no memory or traffic: the learning rate changes neither. */
#ifndef PX_LRSCHED_H
#define PX_LRSCHED_H

#include "dsconfig.h"

/* Read root.scheduler into ds (sched, warm-up, total; "auto" values flagged in ds->autos).
 * dsconfig_resolve_schedule and dsconfig_lr (dsconfig.h) are defined here too. */
int lrsched_parse(const JsonObj *root, DsConfig *ds, PxNotes *notes, PxError *err);

#endif
