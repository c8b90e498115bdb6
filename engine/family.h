/* family: the model families a Hugging Face config.json names by model_type, as one table. A row
 * says which config keys give each dimension (with the defaults of the family's transformers
 * configuration_*.py), which switches change the composition of its blocks and ends, which other
 * keys its configuration class knows (so that a misspelt key is warned about, naming the closest
 * known one), and how its blocks are composed before those switches. It reads a config into a
 * ModelSpec; model.c and activ.c derive tensors, counts, products and activations from it. */
#ifndef PX_FAMILY_H
#define PX_FAMILY_H

#include <stddef.h>

#include "model.h"

typedef struct ModelFamily ModelFamily;

/* The row for a model_type (or an alias such as Falcon's "RefinedWebModel"); NULL if none. */
const ModelFamily *family_find(const char *type);
int family_has_name(const ModelFamily *f, const char *type);
/* The family a config without model_type is read as: GPT-2 when it has n_embd, BERT when it has
 * type_vocab_size, else Llama. */
const char *family_infer(const JsonObj *o);
/* "gpt2, llama, ..." into buf, for messages. */
void family_list(char *buf, size_t n);

/* Read config object o as family f into m (zeroed by the caller but for the MoE defaults set in
 * model_parse): dimensions, composition, dropout; unknown keys become warnings in notes. */
int family_read(const ModelFamily *f, const JsonObj *o, ModelSpec *m, PxNotes *notes,
		PxError *err);

/* Price m with the head of Hugging Face class arch ("BertForSequenceClassification"): for a
 * family with several heads (BERT's), one of its classes, else an error naming where (a file and
 * key) and the classes; for the others only their language-model class (...ForCausalLM,
 * ...LMHeadModel, ...ForConditionalGeneration), which changes nothing. The caller recounts
 * m->n_params. */
int family_set_architecture(ModelSpec *m, const char *arch, const char *where, PxError *err);

#endif
