/* Models: parameter counts of the bundled Hugging Face configs against their published counts, and
 * activation memory against Korthikanti et al. 2022, Table 2 (shared/reference/activations.md). */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/activ.h"
#include "../engine/family.h"
#include "../exec/runner.h"
#include "../kernels/gpt16_cpu.h"
#include "../sim/opcost.h"
#include "fixtures.h"
#include "suites.h"


/* Published counts: Hugging Face's num_parameters() of GPT2LMHeadModel (tied head),
 * LlamaForCausalLM and, for BERT, the class its config's architectures names, BertForMaskedLM
 * (test_bert_heads has the others). GPT-3 175B has no published
 * config; its count is Narayanan et al. 2021's formula
 * 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)) with V = 50257, s = 2048 (174.6B; "175B" in
 * Brown et al. 2020 is that figure rounded). */
static void test_published_counts(void)
{
	static const struct {
		const char *name;
		double published;
	} cases[] = {
		{"gpt2", 124439808},           {"gpt2-medium", 354823168},
		{"gpt2-large", 774030080},     {"gpt2-xl", 1557611200},
		{"llama-2-7b", 6738415616},    {"llama-2-13b", 13015864320},
		{"llama-2-70b", 68976648192},  {"bert-base-uncased", 109514298},
		{"bert-large-uncased", 335174458},
	};
	for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		ModelSpec m;
		if (fx_bundled_model(cases[i].name, &m))
			continue;
		double rel = fabs(m.n_params - cases[i].published) / cases[i].published;
		if (rel > 1e-3)
			fprintf(stderr, "\n%s: %.0f vs published %.0f\n", cases[i].name, m.n_params,
				cases[i].published);
		CU_ASSERT(rel <= 1e-3);
	}
	ModelSpec m;
	if (fx_bundled_model("gpt3-175b", &m))
		return;
	double l = 96, h = 12288, V = 50257, s = 2048;
	double narayanan = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h));
	CU_ASSERT(fabs(m.n_params - narayanan) / narayanan <= 1e-3);
	CU_ASSERT(fabs(m.n_params - 174.6e9) / 174.6e9 <= 1e-3);
}

/* BERT's classes (modeling_bert.py) end the same encoder differently; each count is one a user
 * of transformers has published for bert-base-uncased:
 *   BertModel (encoder and pooler): 109,482,240 (AutoModel.from_pretrained, trainable
 *     parameters printed in a public script; also this suite's count before the heads)
 *   BertForMaskedLM: 109,514,298 (AutoModelForMaskedLM.from_pretrained, printed in the same
 *     script; the Trainer's "Total Params" of BertForMaskedLM in other public logs)
 *   BertForPreTraining: 110,106,428 (the Hub's bert-base-uncased checkpoint, the model class it
 *     was saved from: its safetensors metadata totals 110,106,428 F32 parameters)
 *   BertForSequenceClassification, 2 labels: 109,483,778 (the Trainer's "Number of trainable
 *     parameters = 109483778" in public fine-tuning logs)
 * and for bert-large-uncased BertForMaskedLM 335,174,458 (a public results table), for
 * prajjwal1/bert-tiny (2 layers, h 128, 2 heads, I 512) BertModel 4,385,920 and BertForMaskedLM
 * 4,416,698 (the same script). The MLM head is h x h + h (transform), 2h (its LayerNorm) and V
 * (the decoder's bias; its weight is the word embeddings'), less the pooler's h x h + h: 32,058
 * more at h 768, as the counts say. The classifiers: the pooled token's h x labels + labels. */
static void test_bert_heads(void)
{
	static const struct {
		const char *arch;
		double base, large;
	} cases[] = {
		{"BertModel", 109482240, 335141888},
		{"BertForMaskedLM", 109514298, 335174458},
		{"BertForPreTraining", 110106428, 0},
		{"BertForSequenceClassification", 109483778, 0},
	};
	ModelSpec base, large;
	if (fx_bundled_model("bert-base-uncased", &base) ||
	    fx_bundled_model("bert-large-uncased", &large))
		return;
	CU_ASSERT_STRING_EQUAL(base.arch, "BertForMaskedLM"); /* its config's architectures */
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		PxError err = {0};
		CU_ASSERT_EQUAL(family_set_architecture(&base, cases[i].arch, "test", &err), 0);
		CU_ASSERT_DOUBLE_EQUAL(model_count_params(&base), cases[i].base, 0);
		if (!cases[i].large)
			continue;
		CU_ASSERT_EQUAL(family_set_architecture(&large, cases[i].arch, "test", &err), 0);
		CU_ASSERT_DOUBLE_EQUAL(model_count_params(&large), cases[i].large, 0);
	}
	static const char *const TINY = "{\"model_type\": \"bert\", \"hidden_size\": 128, "
		"\"num_hidden_layers\": 2, \"num_attention_heads\": 2, \"intermediate_size\": 512, "
		"\"architectures\": [\"%s\"]}";
	ModelSpec tiny;
	if (fx_modelf(&tiny, TINY, "BertModel") == 0)
		CU_ASSERT_DOUBLE_EQUAL(tiny.n_params, 4385920, 0);
	if (fx_modelf(&tiny, TINY, "BertForMaskedLM") == 0) {
		CU_ASSERT_DOUBLE_EQUAL(tiny.n_params, 4416698, 0);
		CU_ASSERT_EQUAL(model_tied_elems(&tiny), 30522LL * 128); /* the decoder's weight */
	}

	/* the products of BertForPreTraining's head, b sequences of s tokens: the pooler and the
	 * next-sentence classifier over each sequence's first token, the transform and the tied
	 * decoder over every token (its bias of V the only bias longer than h: 2 per element) */
	PxError err = {0};
	CU_ASSERT_EQUAL_FATAL(family_set_architecture(&base, "BertForPreTraining", "test", &err), 0);
	GemmShape g = {.s = 512, .b = 4, .t = 1, .ep = 1};
	ModelGemm gm[MODEL_MAX_GEMMS];
	int n = model_unit_gemms(&base, (int)base.L + 1, &g, gm);
	CU_ASSERT_EQUAL(n, 4);
	double b = 4, sb = 2048, h = 768, V = 30522;
	CU_ASSERT_DOUBLE_EQUAL(model_gemms_flops(gm, n),
			       2 * (b * h * h + b * h * 2 + sb * h * h + sb * h * V), 1);
}

/* The bytes BertForMaskedLM's head keeps for backward, from modeling_bert.py's modules and what
 * autograd saves for each, fp32, b sequences of s tokens (no pooler: add_pooling_layer=False):
 *   BertPredictionHeadTransform.dense (nn.Linear): its input, the encoder's output, 4 s b h
 *   the activation (GELUActivation, hidden_act "gelu": erf's gelu saves its input): the dense
 *     layer's output, 4 s b h
 *   LayerNorm: its input (the GELU's output), 4 s b h, and the fp32 mean and rstd a row, 8 s b
 *   the decoder (nn.Linear, tied weight, bias): its input, the norm's output, 4 s b h
 *   CrossEntropyLoss on the scores as they are: log_softmax's output, 4 s b V
 * = s b (16 h + 8 + 4 V); at s 512, b 2, h 768, V 30522: 137,609,216 bytes. In bf16 under
 * DeepSpeed (no autocast) each tensor of the model's type is 2 bytes a value: the log-softmax's
 * too, since the loss takes the bf16 scores without an upcast; the norm's statistics stay fp32:
 * s b (8 h + 8 + 2 V). */
static void test_bert_mlm_head_bytes(void)
{
	ModelSpec m;
	if (fx_bundled_model("bert-base-uncased", &m))
		return;
	m.dropout = m.attn_dropout = 0;
	ActivShape x = {.s = 512, .b = 2, .t = 1, .elem_bytes = 4, .hf_eager = 1};
	double sb = 1024, h = 768, V = 30522;
	CU_ASSERT_DOUBLE_EQUAL(activ_head_bytes(&m, &x), sb * (16 * h + 8 + 4 * V), 0);
	CU_ASSERT_DOUBLE_EQUAL(sb * (16 * h + 8 + 4 * V), 137609216.0, 0);
	x.elem_bytes = 2;
	CU_ASSERT_DOUBLE_EQUAL(activ_head_bytes(&m, &x), sb * (8 * h + 8 + 2 * V), 0);
	x.autocast = 1; /* log_softmax is an fp32 op under autocast: its output fp32 */
	CU_ASSERT_DOUBLE_EQUAL(activ_head_bytes(&m, &x), sb * (8 * h + 8 + 4 * V), 0);
}

/* The scenario's "architecture" chooses the class over the config's architectures; a class the
 * family does not have is refused naming the file, the key and the classes; a causal LM's own
 * class and its classifiers are accepted for the other families, any other refused; a config
 * naming a class Parallax does not know is priced as BertModel with a warning. */
static void test_architecture_key(void)
{
	static const char *const FMT = "{%s, \"architecture\": \"%s\", \"deepspeed\": "
		"{\"train_micro_batch_size_per_gpu\": 1}, \"cluster\": {\"gpu\": \"A100-80GB\", "
		"\"nodes\": 1, \"gpus_per_node\": 1}, \"seq_length\": 128}";
	Scenario sc;
	Prediction pr;
	if (fx_predictf(&sc, &pr, FMT, fx_model("bert-base-uncased"),
			"BertForSequenceClassification") == 0) {
		CU_ASSERT_DOUBLE_EQUAL(sc.model.n_params, 109483778, 0);
		char *j = scenario_resolved_json(&sc, 1, 1);
		PX_ASSERT_HAS(j, "\"architecture\":\"BertForSequenceClassification\"");
		free(j);
		fx_free(&sc, &pr);
	}
	if (fx_predictf(&sc, &pr, FMT, fx_model("gpt2"), "GPT2LMHeadModel") == 0) {
		CU_ASSERT_DOUBLE_EQUAL(sc.model.n_params, 124439808, 0);
		fx_free(&sc, &pr);
	}
	static const char *const bad[][3] = {
		{"bert-base-uncased", "BertForCausalLM",
		 "architecture: \"BertForCausalLM\" is not a bert class Parallax prices; expected one "
		 "of BertModel, BertForMaskedLM, BertForPreTraining"},
		{"llama-2-7b", "LlamaForMaskedLM",
		 "architecture: \"LlamaForMaskedLM\": a llama model is priced with its "
		 "language-model head (...ForCausalLM, ...LMHeadModel) or a classifier"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char path[512], json[2048];
		snprintf(path, sizeof(path), "%s/architecture-%zu.json", px_test_tmpdir(), i);
		snprintf(json, sizeof(json), FMT, fx_model(bad[i][0]), bad[i][1]);
		px_test_write_file(path, json);
		PxError err = {0};
		fx_refused(path, NULL, &err);
		PX_ASSERT_HAS(err.msg, path);
		PX_ASSERT_HAS(err.msg, bad[i][2]);
	}
	/* a config's own class Parallax does not know: BertModel, said */
	char path[512], cfg[512];
	snprintf(cfg, sizeof(cfg), "%s/bert-custom-config.json", px_test_tmpdir());
	px_test_write_file(cfg, "{\"model_type\": \"bert\", \"architectures\": "
			   "[\"BertForSomethingElse\"]}");
	snprintf(path, sizeof(path), "%s/bert-custom.json", px_test_tmpdir());
	char json[2048];
	snprintf(json, sizeof(json), "{\"model\": \"%s\", \"deepspeed\": "
		 "{\"train_micro_batch_size_per_gpu\": 1}, \"cluster\": {\"gpu\": \"A100-80GB\", "
		 "\"nodes\": 1, \"gpus_per_node\": 1}, \"seq_length\": 128}", cfg);
	px_test_write_file(path, json);
	PxError err = {0};
	CU_ASSERT_EQUAL_FATAL(scenario_load(&sc, path, NULL, &err), 0);
	CU_ASSERT_STRING_EQUAL(sc.model.arch, "BertModel");
	CU_ASSERT_DOUBLE_EQUAL(sc.model.n_params, 109482240, 0);
	int warned = 0;
	for (int i = 0; i < sc.notes.n_warnings; i++)
		warned |= strstr(sc.notes.warnings[i], "BertForSomethingElse is not a class Parallax "
					 "prices; priced as BertModel") != NULL;
	CU_ASSERT(warned);
	scenario_free(&sc);
}

/* A causal LM's classifier classes, by the config's architectures or the scenario's key:
 * GPT2ForSequenceClassification drops the LM head (GPT-2's is tied: no parameter goes) and adds
 * the score, h x num_labels without a bias: gpt2 124,439,808 + 768 x 2 = 124,441,344 and
 * gpt2-medium 354,825,216, the counts published for them (e.g. a public NAS script's
 * original_model_size table); LlamaForSequenceClassification as a reward model (num_labels 1)
 * drops Llama-2 7B's untied lm_head, 32,000 x 4,096, for a 4,096 x 1 score: 6,738,415,616 -
 * 131,072,000 + 4,096 = 6,607,347,712 (modeling_llama.py's modules, counted by hand). The head
 * keeps no logits over the vocabulary: GPT-2 small at micro-batch 4 x 1024 in fp16 keeps the
 * final norm's 2 s b h and nothing of 4 s b V. And a scenario's "architecture" naming the LM class
 * again restores the LM head over a classifier config. An encoder-decoder (T5) has none of these
 * classifiers: a config naming T5ForSequenceClassification is priced as its LM, as before the
 * classifiers were modelled, and the scenario key refuses the class. */
static void test_causal_classifiers(void)
{
	static const char *const SEQ = "{\"model_type\": \"gpt2\", \"n_embd\": %d, \"n_layer\": %d, "
		"\"n_head\": 16, \"architectures\": [\"GPT2ForSequenceClassification\"]}";
	ModelSpec m;
	if (fx_modelf(&m, SEQ, 768, 12) == 0) {
		CU_ASSERT_DOUBLE_EQUAL(m.n_params, 124441344, 0);
		CU_ASSERT_EQUAL(model_tied_elems(&m), 0);
		ActivShape x = {.s = 1024, .b = 4, .t = 1, .elem_bytes = 2};
		CU_ASSERT_DOUBLE_EQUAL(activ_head_bytes(&m, &x), 2.0 * 2 * 1024 * 4 * 768, 0);
		PxError err = {0};
		CU_ASSERT_EQUAL(family_set_architecture(&m, "GPT2LMHeadModel", "test", &err), 0);
		CU_ASSERT_DOUBLE_EQUAL(model_count_params(&m), 124439808, 0);
	}
	if (fx_modelf(&m, SEQ, 1024, 24) == 0)
		CU_ASSERT_DOUBLE_EQUAL(m.n_params, 354825216, 0);
	ModelSpec t5;
	if (fx_modelf(&t5, "{\"model_type\": \"t5\", \"architectures\": "
		      "[\"T5ForSequenceClassification\"]}") == 0) {
		CU_ASSERT(t5.lay.lm_head && !t5.lay.cls_labels && !t5.arch[0]);
		PxError t5err = {0};
		CU_ASSERT_EQUAL(family_set_architecture(&t5, "T5ForSequenceClassification", "test",
							&t5err), -1);
	}
	ModelSpec llama;
	if (fx_bundled_model("llama-2-7b", &llama))
		return;
	llama.num_labels = 1;
	PxError err = {0};
	CU_ASSERT_EQUAL_FATAL(family_set_architecture(&llama, "LlamaForSequenceClassification",
						      "test", &err), 0);
	CU_ASSERT_DOUBLE_EQUAL(model_count_params(&llama), 6607347712.0, 0);
}

/* Megatron's padded vocabulary (parallelism.make_vocab_size_divisible_by; Megatron-LM's
 * _vocab_size_with_padding rounds the vocabulary up to a multiple of the flag times tp): GPT-3's
 * 50,257 tokens become 50,304 rows at tp 1 and 51,200 at tp 8, the vocabulary Narayanan et al.
 * 2021 count (their parameter formula's V); the tied embedding's extra rows are parameters
 * (943 x 12,288 more at tp 8) and each rank holds 51,200 / 8 of them. Absent, nothing is padded;
 * 0 is refused naming the key. */
static void test_padded_vocab(void)
{
	static const char FMT[] = "{%s, \"parallelism\": {\"tp\": %d%s}, \"deepspeed\": "
		"{\"train_micro_batch_size_per_gpu\": 1}, \"cluster\": {\"gpu\": \"A100-80GB\", "
		"\"nodes\": 1, \"gpus_per_node\": 8}, \"seq_length\": 2048}";
	static const struct {
		int tp;
		const char *flag;
		long long V;
	} cases[] = {
		{1, "", 50257},
		{1, ", \"make_vocab_size_divisible_by\": 128", 50304},
		{8, ", \"make_vocab_size_divisible_by\": 128", 51200},
	};
	ModelSpec plain;
	if (fx_bundled_model("gpt3-175b", &plain))
		return;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		Scenario sc;
		Prediction pr;
		if (fx_predictf(&sc, &pr, FMT, fx_model("gpt3-175b"), cases[i].tp, cases[i].flag))
			continue;
		CU_ASSERT_EQUAL(sc.model.V, cases[i].V);
		CU_ASSERT_EQUAL(sc.model.vocab_size, 50257);
		CU_ASSERT_DOUBLE_EQUAL(sc.model.n_params,
				       plain.n_params + (double)(cases[i].V - 50257) * 12288, 0);
		char *j = scenario_resolved_json(&sc, 8, 8 / cases[i].tp);
		CU_ASSERT_EQUAL(strstr(j, "\"padded_vocab_size\"") != NULL, cases[i].V != 50257);
		free(j);
		fx_free(&sc, &pr);
	}
	char path[512], json[2048];
	snprintf(path, sizeof(path), "%s/vocab-divisible-0.json", px_test_tmpdir());
	snprintf(json, sizeof(json), FMT, fx_model("gpt3-175b"), 8,
		 ", \"make_vocab_size_divisible_by\": 0");
	px_test_write_file(path, json);
	PxError err = {0};
	fx_refused(path, NULL, &err);
	PX_ASSERT_HAS(err.msg, "make_vocab_size_divisible_by");
	PX_ASSERT_HAS(err.msg, path);
}

/* Units partition the model: their parameters add up to the whole. */
static void test_units_sum_to_model(void)
{
	static const char *const names[] = {"gpt2", "llama-2-70b", "bert-base-uncased"};
	for (int i = 0; i < 3; i++) {
		ModelSpec m;
		if (fx_bundled_model(names[i], &m))
			continue;
		double sum = 0;
		for (int u = 0; u < model_n_units(&m); u++)
			sum += (double)model_unit_params(&m, u);
		CU_ASSERT_DOUBLE_EQUAL(sum, m.n_params, 0);
	}
	ModelSpec g;
	if (fx_bundled_model("gpt2", &g) == 0) /* GPT-2 ties its head to the token embedding */
		CU_ASSERT_EQUAL(model_tied_elems(&g), 50257LL * 768);
}

/* ---- activations: Korthikanti et al. 2022, Table 2, bytes per layer ---- */

/* A GPT-style layer as the paper assumes: dropout (GPT-2's default 0.1 everywhere), kv = h,
 * I = 4h, 16-bit activations. */
static ModelSpec paper_layer(long long h, long long a)
{
	ModelSpec m;
	if (fx_modelf(&m, "{\"model_type\": \"gpt2\", \"n_embd\": %lld, \"n_head\": %lld, "
		      "\"n_layer\": 1, \"vocab_size\": 51200, \"n_positions\": 2048}", h, a))
		memset(&m, 0, sizeof(m));
	return m;
}

static void check_table2(long long s, long long b, long long h, long long a, int t)
{
	ModelSpec m = paper_layer(h, a);
	double sbh = (double)s * b * h, as_h = 5.0 * a * s / h;
	ActivShape tp = {.s = s, .b = b, .t = t, .sp = 0, .elem_bytes = 2};
	ActivShape sp = tp;
	sp.sp = 1;

	if (t == 1) /* no parallelism: sbh(34 + 5as/h) */
		CU_ASSERT_DOUBLE_EQUAL(activ_block_bytes(&m, &tp, CKPT_NONE), sbh * (34 + as_h), 1e-6);
	/* tensor parallel: sbh(10 + 24/t + 5as/(ht)) */
	CU_ASSERT_DOUBLE_EQUAL(activ_block_bytes(&m, &tp, CKPT_NONE), sbh * (10 + 24.0 / t + as_h / t),
			       1e-6 * sbh);
	/* tensor + sequence parallel: sbh(34/t + 5as/(ht)) */
	CU_ASSERT_DOUBLE_EQUAL(activ_block_bytes(&m, &sp, CKPT_NONE), sbh * (34.0 / t + as_h / t),
			       1e-6 * sbh);
	/* tensor parallel + selective recompute: sbh(10 + 24/t) */
	CU_ASSERT_DOUBLE_EQUAL(activ_block_bytes(&m, &tp, CKPT_SELECTIVE), sbh * (10 + 24.0 / t),
			       1e-6 * sbh);
	/* tensor + sequence parallel + selective recompute: 34 sbh / t */
	CU_ASSERT_DOUBLE_EQUAL(activ_block_bytes(&m, &sp, CKPT_SELECTIVE), 34.0 * sbh / t, 1e-6 * sbh);
	/* full recompute keeps only the layer input: 2sbh */
	CU_ASSERT_DOUBLE_EQUAL(activ_checkpoint_bytes(&m, &tp, 0), 2 * sbh, 0);
}

static void test_korthikanti_table2(void)
{
	check_table2(2048, 1, 12288, 96, 1); /* GPT-3 175B */
	check_table2(2048, 1, 12288, 96, 8);
	check_table2(2048, 1, 20480, 128, 8); /* MT-NLG 530B */
	check_table2(1024, 4, 1600, 25, 2);
	check_table2(512, 3, 1024, 16, 4);
}

/* The paper's quoted values of 5as/h: 80 for GPT-3 175B, 64 for MT-NLG 530B. */
static void test_korthikanti_attention_term(void)
{
	ActivShape x = {.s = 2048, .b = 1, .t = 1, .elem_bytes = 2};
	ModelSpec gpt3 = paper_layer(12288, 96), mtnlg = paper_layer(20480, 128);
	double sbh3 = 2048.0 * 12288, sbh5 = 2048.0 * 20480;
	double full3 = activ_block_bytes(&gpt3, &x, CKPT_NONE);
	double sel3 = activ_block_bytes(&gpt3, &x, CKPT_SELECTIVE);
	CU_ASSERT_DOUBLE_EQUAL((full3 - sel3) / sbh3, 80, 1e-9);
	double full5 = activ_block_bytes(&mtnlg, &x, CKPT_NONE);
	double sel5 = activ_block_bytes(&mtnlg, &x, CKPT_SELECTIVE);
	CU_ASSERT_DOUBLE_EQUAL((full5 - sel5) / sbh5, 64, 1e-9);
}

/* Embedding and output layer, one pipeline stage: (sbhL/t)(p/L + (4/L)(1 + V/h)) with p = 1, the
 * paper's figure under tensor and sequence parallelism (section 4.3: the embedding's dropout mask
 * sbh and the final norm's input and output 4sbh are split by sequence across the t ranks). Without
 * sequence parallelism those are the stream's, whole on every tensor-parallel rank (Megatron runs
 * the embedding dropout and the final norm on the full sequence), and only the vocabulary-parallel
 * softmax 4sbV is split: sbh + 4sbh + 4sbV/t. */
static void test_korthikanti_ends(void)
{
	ModelSpec m = paper_layer(12288, 96);
	for (int t = 1; t <= 8; t *= 2) {
		ActivShape x = {.s = 2048, .b = 2, .t = t, .sp = t > 1, .elem_bytes = 2};
		double L = 96, sbh = 2048.0 * 2 * 12288, sbhL = sbh * L;
		double expected = sbhL / t * (1 / L + 4 / L * (1 + 51200.0 / 12288));
		CU_ASSERT_DOUBLE_EQUAL(activ_ends_bytes(&m, &x), expected, 1e-6 * expected);
		x.sp = 0;
		expected = sbh + 4 * sbh + 4 * 2048.0 * 2 * 51200 / t;
		CU_ASSERT_DOUBLE_EQUAL(activ_ends_bytes(&m, &x), expected, 1e-6 * expected);
	}
}

/* The CUDA executor's logits rows are padded to a multiple of 8 elements (kernels/ops_cuda.h), and
 * backend cuda's prediction says so: GPT-2's odd 50,257 becomes 50,264, 7 fp32 columns more per
 * token, 8 x 1024 x 7 x 4 = 229,376 bytes at batch 8 x 1024, the difference the executor's own
 * head layout has (gpt16_head_act_bytes_ld); a vocabulary already a multiple of 8 gains nothing.
 * results/gpu/lease4 measured GPT-2 124M's activations at the padded prediction to the byte. */
static void test_cuda_logits_padding(void)
{
	ModelSpec m = paper_layer(768, 12);
	m.V = 50257;
	ActivShape x = {.s = 1024, .b = 8, .t = 1, .elem_bytes = 2};
	double plain = activ_head_bytes(&m, &x);
	x.logits_align = 8;
	CU_ASSERT_DOUBLE_EQUAL(activ_head_bytes(&m, &x) - plain, 229376, 0);
	GptConfig c = {.V = 50257, .max_T = 1024, .C = 768, .L = 12, .NH = 12};
	CU_ASSERT_EQUAL(gpt16_head_act_bytes_ld(&c, PREC_BF16, 8, 1024, 50264) -
				gpt16_head_act_bytes(&c, PREC_BF16, 8, 1024),
			229376);
	m.V = 50304;
	x.logits_align = 0;
	plain = activ_head_bytes(&m, &x);
	x.logits_align = 8;
	CU_ASSERT_DOUBLE_EQUAL(activ_head_bytes(&m, &x), plain, 0);
}

/* Whole-scenario check: GPT-2 1.5B, seq 1024, micro-batch 4, bf16, no checkpointing, ZeRO-0 on
 * one GPU: the activation peak is L layers of sbh(34 + 5as/h) plus the ends (5sbh + 4sbV). */
static void test_scenario_activations(void)
{
	char json[1024];
	Scenario sc;
	Prediction pr;
	snprintf(json, sizeof(json),
		 "{%s, \"deepspeed\": {\"train_micro_batch_size_per_gpu\": 4, \"bf16\":"
		 " {\"enabled\": true}}, \"cluster\": {\"gpu\": \"H200\", \"nodes\": 1,"
		 " \"gpus_per_node\": 1}, \"seq_length\": 1024}", fx_model("gpt2-xl"));
	if (fx_predict(&sc, &pr, json))
		return;
	double s = 1024, b = 4, h = 1600, a = 25, L = 48, V = 50257;
	double expected = L * s * b * h * (34 + 5 * a * s / h) + 5 * s * b * h + 4 * s * b * V;
	CU_ASSERT_DOUBLE_EQUAL(pr.stages[0].mem.place[PLACE_GPU].cat_peak[CAT_ACTIV], expected, 1);
	fx_free(&sc, &pr);

	/* full recompute: L inputs of 2sbh plus the larger of the ends (alive at the end of the
	 * forward, 5sbh + 4sbV = 130.6 sbh here) and one rebuilt layer (114 sbh). The GPU's peak
	 * itself comes at the optimizer step here (fp32 gradients), so this is the activations'
	 * own peak. */
	snprintf(json, sizeof(json),
		 "{%s, \"activation_checkpointing\": \"full\", \"deepspeed\":"
		 " {\"train_micro_batch_size_per_gpu\": 4, \"bf16\": {\"enabled\": true}},"
		 " \"cluster\": {\"gpu\": \"H200\", \"nodes\": 1, \"gpus_per_node\": 1},"
		 " \"seq_length\": 1024}", fx_model("gpt2-xl"));
	if (fx_predict(&sc, &pr, json))
		return;
	double layer = s * b * h * (34 + 5 * a * s / h), ends = 5 * s * b * h + 4 * s * b * V;
	double ckpt = L * 2 * s * b * h + (ends > layer ? ends : layer);
	CU_ASSERT_DOUBLE_EQUAL(pr.stages[0].mem.place[PLACE_GPU].cat_peak[CAT_ACTIV], ckpt, 1);
	fx_free(&sc, &pr);
}

/* What Hugging Face's eager GPT-2 block keeps for backward, op by op (transformers
 * modeling_gpt2.py GPT2Block with eager attention and activations.py NewGELUActivation; autograd
 * keeps what each op's backward reads), training with dropout 0.1, per token, d bytes a value
 * (fp16: 2), GPT-2 small: h 768, I = 4h = 3072, a 12 heads, s 1024:
 *   ln_1 (nn.LayerNorm, native_layer_norm): its input, d h, and the row's fp32 mean and rstd, 8
 *   attn.c_attn (Conv1D: addmm): its input, ln_1's output, d h
 *   query, key, value: views of c_attn's output, which the two matmuls keep: d 3h
 *   softmax: its output, d a s; attn_dropout: its mask (bool), a s, and its output, kept by
 *     the matmul with value, d a s (the scaling and the causal mask's where keep no per-token
 *     tensor: a 0-dim divisor, the model's (1, 1, s, s) mask buffer)
 *   attn.c_proj: its input, the merged heads (a contiguous copy), d h; resid_dropout: its mask, h
 *   ln_2: its input (the residual sum), d h, and 8
 *   mlp.c_fc: its input, ln_2's output, d h
 *   act, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) in elementwise ops: pow keeps x
 *     (c_fc's output), tanh its output, the last product both factors, 0.5 x and 1 + tanh: d 4I
 *   mlp.c_proj: its input, the GELU's output, d I; mlp.dropout: its mask, h
 * = d (8h + 5I) + (2d + 1) a s + 2h + 16 = 2 (6,144 + 15,360) + 61,440 + 1,536 + 16 = 106,000
 * bytes a token, 108,544,000 for the 1024. Korthikanti's count (model_code megatron: fused GELU
 * and LayerNorm kernels keep their inputs alone) is d (8h + 2I) + (2d + 1) a s + 2h = 87,552 a
 * token, 89,653,248 (Table 2's sbh (34 + 5as/h)). */
static void test_hf_eager_gpt2_block(void)
{
	ModelSpec m;
	CU_ASSERT_EQUAL_FATAL(fx_bundled_model("gpt2", &m), 0);
	CU_ASSERT(m.gelu_new);
	ActivShape x = {.s = 1024, .b = 1, .t = 1, .elem_bytes = 2};
	CU_ASSERT_DOUBLE_EQUAL(activ_block_bytes(&m, &x, CKPT_NONE), 89653248.0, 0);
	x.hf_eager = 1;
	CU_ASSERT_DOUBLE_EQUAL(activ_block_bytes(&m, &x, CKPT_NONE), 108544000.0, 0);
	/* a fused GELU ("gelu_pytorch_tanh": F.gelu(approximate="tanh")) keeps its input alone:
	 * the norms' statistics are what is left */
	m.gelu_new = 0;
	CU_ASSERT_DOUBLE_EQUAL(activ_block_bytes(&m, &x, CKPT_NONE), 89653248.0 + 16 * 1024, 0);
}

/* Hugging Face's eager Llama block (modeling_llama.py LlamaDecoderLayer, eager_attention_forward,
 * LlamaRMSNorm, LlamaMLP with SiLU), op by op, per token, d = 2 (bf16), no dropout
 * (attention_dropout 0): Llama-2 7B, h 4096, I 11008, a 32 = kv, s 4096:
 *   input_layernorm: hidden.to(float32), which pow and the product keep, 4h; the normalized rows
 *     cast back, which the weight's product keeps, d h; each row's rsqrt, fp32, 4
 *   q/k/v_proj: their input, the norm's output, d h
 *   rotary: q * cos + rotate_half(q) * sin keeps cos and sin (the model's, shared by the
 *     layers); the rotated q and k, which QK^T keeps, d h each
 *   softmax(dtype=float32): its fp32 output, 4 a s; .to(bf16), which the product with v keeps,
 *     d a s; v, d h (dropout at p 0 returns its input)
 *   o_proj: its input, d h; post_attention_layernorm: 4h + d h + 4 again, its output d h kept by
 *     gate_proj and up_proj
 *   mlp: gate_proj's output (SiLU's input), SiLU's output and up_proj's output (the product's
 *     operands), the product (down_proj's input): d 4I
 * = 24h + 8I + 6as + 8 = 98,304 + 88,064 + 786,432 + 8 = 972,808 bytes a token, 3,984,621,568 for
 * the 4096; Korthikanti's (megatron) d (8h + 4I) + d a s = 415,744, 1,702,887,424. Under
 * grouped-query attention (Llama-2 70B: h 8192, a 64, kv 8, d_h 128) repeat_kv's keys and values
 * for every head are what QK^T and the product keep: 2 d (a - kv) d_h = 28,672 bytes a token
 * more, beside the norms' 2 (4h + 4) and the fp32 softmax's 4 a s. FlashAttention-2 keeps none of
 * the scores and takes the kv heads as they are: the norms' alone. */
static void test_hf_eager_llama_block(void)
{
	ModelSpec m;
	CU_ASSERT_EQUAL_FATAL(fx_bundled_model("llama-2-7b", &m), 0);
	ActivShape x = {.s = 4096, .b = 1, .t = 1, .elem_bytes = 2};
	CU_ASSERT_DOUBLE_EQUAL(activ_block_bytes(&m, &x, CKPT_NONE), 1702887424.0, 0);
	x.hf_eager = 1;
	CU_ASSERT_DOUBLE_EQUAL(activ_block_bytes(&m, &x, CKPT_NONE), 3984621568.0, 0);
	ModelSpec big;
	CU_ASSERT_EQUAL_FATAL(fx_bundled_model("llama-2-70b", &big), 0);
	ActivShape k = {.s = 4096, .b = 1, .t = 1, .elem_bytes = 2};
	double megatron = activ_block_bytes(&big, &k, CKPT_NONE), s = 4096, h = 8192, a = 64;
	k.hf_eager = 1;
	CU_ASSERT_DOUBLE_EQUAL(activ_block_bytes(&big, &k, CKPT_NONE) - megatron,
			       s * (2 * (4 * h + 4) + 4 * a * s + 28672), 0);
	k.flash = 1;
	double flash = activ_block_bytes(&big, &k, CKPT_NONE);
	k.hf_eager = 0;
	CU_ASSERT_DOUBLE_EQUAL(flash - activ_block_bytes(&big, &k, CKPT_NONE), s * 2 * (4 * h + 4),
			       0);
}

/* Hugging Face's eager Gemma blocks, op by op (modeling_gemma.py GemmaDecoderLayer, GemmaRMSNorm,
 * GemmaMLP with gelu_pytorch_tanh, eager_attention_forward; modeling_gemma2.py's adds the sandwich
 * and the soft-capping), per token, d = 2 (bf16), no dropout, s 4096.
 * Gemma 7B (h 3072, I 24576, a = kv = 16, d_h 256: a d_h = 4096):
 *   each GemmaRMSNorm: x.float(), which pow and the product keep, 4h (in place of the input);
 *     each row's fp32 rsqrt, 4; the fp32 normalized rows, which the product with 1 + weight
 *     keeps, 4h; its output cast back, kept by the next projections, d h: 8h + 4 + d h, twice
 *   q and k after rotary, kept by QK^T, v kept by the product, the heads' output kept by o_proj:
 *     d 4 x 4096
 *   softmax(dtype=float32): its fp32 output, 4 a s; .to(bf16), kept by the product with v, d a s
 *   the MLP: gate_proj's output (the fused GELU's input), the GELU's output, up_proj's output
 *     and the product: d 4I
 * = 2 (8h + 4 + 2h) + 2 x 16,384 + 6 a s + 8I = 61,448 + 32,768 + 196,608 + 96 s = 684,040
 * bytes a token, 2,801,827,840 for the 4096. In fp32 (d = 4) the input is x.float() itself and
 * the softmax's output the tensor the product keeps: 2 (12h + 4) + 4 x 16,384 + 4 a s + 16I
 * = 532,488 + 64 s.
 * Gemma 2 9B (h 3584, I 14336, a 16, kv 8, d_h 256), four norms a block: input_layernorm
 *   8h + 4 + d h; post_attention_layernorm on o_proj's output, which the residual add takes,
 *   8h + 4; pre_feedforward_layernorm 8h + 4 + d h; post_feedforward_layernorm 8h + 4
 *   q after rotary, repeat_kv's k and v for all 16 heads (the kv heads' own are not kept), the
 *     heads' output: d 4 x 4096
 *   the scores: soft-capping's tanh output (the division and product by 50 keep nothing), d a s;
 *     the fp32 softmax, 4 a s; its bf16 copy, d a s
 *   the MLP: d 4I
 * = 4 (8h + 4) + 2 d h + 2 x 16,384 + 8 a s + 8I = 114,704 + 14,336 + 32,768 + 114,688 + 128 s
 * = 276,496 + 128 s bytes a token, 3,280,011,264 for the 4096. */
static void test_hf_eager_gemma_blocks(void)
{
	double s = 4096;
	ModelSpec m;
	CU_ASSERT_EQUAL_FATAL(fx_bundled_model("gemma-7b", &m), 0);
	ActivShape x = {.s = 4096, .b = 1, .t = 1, .elem_bytes = 2, .hf_eager = 1};
	CU_ASSERT_DOUBLE_EQUAL(activ_block_bytes(&m, &x, CKPT_NONE), 2801827840.0, 0);
	x.elem_bytes = 4;
	CU_ASSERT_DOUBLE_EQUAL(activ_block_bytes(&m, &x, CKPT_NONE), (532488 + 64 * s) * s, 0);
	CU_ASSERT_EQUAL_FATAL(fx_bundled_model("gemma-2-9b", &m), 0);
	CU_ASSERT_EQUAL(m.attn_softcap, 50);
	CU_ASSERT_EQUAL(m.final_softcap, 30);
	x.elem_bytes = 2;
	CU_ASSERT_DOUBLE_EQUAL(activ_block_bytes(&m, &x, CKPT_NONE), 3280011264.0, 0);
	/* without soft-capping (attn_logit_softcapping null) the tanh's d a s goes */
	m.attn_softcap = 0;
	CU_ASSERT_DOUBLE_EQUAL(activ_block_bytes(&m, &x, CKPT_NONE), (276496 + 96 * s) * s, 0);
	/* FlashAttention-2 (its own soft-capping) keeps none of the scores: the norms' extra alone
	 * beyond Korthikanti's count (test_family.c's 6h + 4 x 4096 + 4I per d, and 2 a s) */
	m.attn_softcap = 50;
	x.flash = 1;
	double flash = activ_block_bytes(&m, &x, CKPT_NONE);
	x.hf_eager = 0;
	CU_ASSERT_DOUBLE_EQUAL(flash - activ_block_bytes(&m, &x, CKPT_NONE),
			       s * 4 * (6 * 3584.0 + 4), 0);
}

/* Gemma-2's head under model_code huggingface: the final GemmaRMSNorm's fp32 copy, normalized
 * rows and rsqrt (6h + 4 beyond its bf16 input) and the logits' soft-capping, whose tanh output
 * (bf16, 2 bytes a logit) the loss's backward reads, beside the fp32 softmax's 4: per token
 * 2 (2h) + 6h + 4 + 6V for Korthikanti's 2 (2h) + 4V. */
static void test_hf_gemma2_head(void)
{
	ModelSpec m;
	CU_ASSERT_EQUAL_FATAL(fx_bundled_model("gemma-2-9b", &m), 0);
	ActivShape x = {.s = 1024, .b = 2, .t = 1, .elem_bytes = 2};
	double sb = 2048, h = 3584, V = 256000;
	int head = model_n_units(&m) - 1;
	CU_ASSERT_DOUBLE_EQUAL(activ_unit_bytes(&m, head, &x, CKPT_NONE, 0), sb * (4 * h + 4 * V), 0);
	x.hf_eager = 1;
	CU_ASSERT_DOUBLE_EQUAL(activ_unit_bytes(&m, head, &x, CKPT_NONE, 0),
			       sb * (4 * h + 6 * h + 4 + 6 * V), 0);
}

/* The same under a whole scenario, GPT-2 1.5B (h 1600, a 25, I 6400, 48 layers, V 50,257), seq
 * 1024, micro-batch 4, bf16, model_code huggingface: each layer d (8h + 5I) + 5as + 2h + 16 bytes
 * a token, the ends Korthikanti's 5sbh + 4sbV with the final LayerNorm's mean and rstd (8 sb),
 * and at the head's backward, where the activations peak, Hugging Face's causal-LM loss
 * (ForCausalLMLoss) holds nll_loss's and log_softmax's fp32 gradients beside the kept
 * log-softmax: 8 sbV more (build.c loss_temp_bytes). Its forward holds the bf16 logits and their
 * fp32 upcast while the loss runs, (2 + 4) sbV; in fp32 the logits alone (the upcast is the
 * tensor itself), 4 sbV; under model_code megatron nothing. */
static void test_hf_eager_scenario(void)
{
	static const char FMT[] =
		"{%s, \"model_code\": \"huggingface\", \"deepspeed\": {\"train_micro_batch_size_per_gpu\":"
		" 4, \"bf16\": {\"enabled\": %s}}, \"cluster\": {\"gpu\": \"H200\", \"nodes\": 1,"
		" \"gpus_per_node\": 1}, \"seq_length\": 1024}";
	Scenario sc;
	Prediction pr;
	if (fx_predictf(&sc, &pr, FMT, fx_model("gpt2-xl"), "true"))
		return;
	double s = 1024, b = 4, h = 1600, a = 25, L = 48, V = 50257, I = 4 * h;
	double layer = s * b * (2 * (8 * h + 5 * I) + 5 * a * s + 2 * h + 16);
	double ends = 5 * s * b * h + 8 * s * b + 4 * s * b * V;
	CU_ASSERT_DOUBLE_EQUAL(pr.stages[0].mem.place[PLACE_GPU].cat_peak[CAT_ACTIV],
			       L * layer + ends + 8 * s * b * V, 1);
	double temps[2] = {0, 0};
	int n = 0;
	const Schedule *k = &pr.stages[0].sched;
	for (int i = 0; i < k->n; i++)
		if (k->ops[i].kind == OP_ALLOC && k->ops[i].what == BUF_LOSS_TEMP && n < 2)
			temps[n++] = k->ops[i].bytes;
	CU_ASSERT_EQUAL(n, 2); /* one micro-batch: the forward's, the backward's */
	CU_ASSERT_DOUBLE_EQUAL(temps[0], 6 * s * b * V, 0);
	CU_ASSERT_DOUBLE_EQUAL(temps[1], 8 * s * b * V, 0);
	fx_free(&sc, &pr);
	if (fx_predictf(&sc, &pr, FMT, fx_model("gpt2-xl"), "false"))
		return;
	k = &pr.stages[0].sched;
	for (int i = 0; i < k->n; i++)
		if (k->ops[i].kind == OP_ALLOC && k->ops[i].what == BUF_LOSS_TEMP) {
			CU_ASSERT_DOUBLE_EQUAL(k->ops[i].bytes, 4 * s * b * V, 0);
			break;
		}
	fx_free(&sc, &pr);
}

/* BertForMaskedLM's loss in a scenario, bert-base-uncased, seq 512, micro-batch 4, bf16 under
 * DeepSpeed, model_code huggingface: CrossEntropyLoss takes the bf16 prediction scores as they
 * are (no upcast), so its forward holds the scores, 2 sbV, and its backward nll_loss's and
 * log_softmax's gradients in bf16, 4 sbV (against a causal LM's 6 and 8 sbV above). T5's
 * (T5ForConditionalGeneration: CrossEntropyLoss(ignore_index=-100) on lm_logits) likewise over
 * the decoder's tokens: t5-base, V 32,128, 512 of them. */
static void test_bert_mlm_loss(void)
{
	static const char FMT[] =
		"{%s, \"model_code\": \"huggingface\", \"deepspeed\": {\"train_micro_batch_size_per_gpu\":"
		" 4, \"bf16\": {\"enabled\": true}}, \"cluster\": {\"gpu\": \"H200\", \"nodes\": 1,"
		" \"gpus_per_node\": 1}, \"seq_length\": 512}";
	static const char *const models[] = {"bert-base-uncased", "t5-base"};
	static const double vocab[] = {30522, 32128};
	for (int m = 0; m < 2; m++) {
		Scenario sc;
		Prediction pr;
		if (fx_predictf(&sc, &pr, FMT, fx_model(models[m])))
			continue;
		double sbV = 512 * 4 * vocab[m], temps[2] = {0, 0};
		int n = 0;
		const Schedule *k = &pr.stages[0].sched;
		for (int i = 0; i < k->n; i++)
			if (k->ops[i].kind == OP_ALLOC && k->ops[i].what == BUF_LOSS_TEMP && n < 2)
				temps[n++] = k->ops[i].bytes;
		CU_ASSERT_EQUAL(n, 2);
		CU_ASSERT_DOUBLE_EQUAL(temps[0], 2 * sbV, 0);
		CU_ASSERT_DOUBLE_EQUAL(temps[1], 4 * sbV, 0);
		fx_free(&sc, &pr);
	}
}

/* The same GPT-2 block under torch autocast (the Trainer's fp16 without DeepSpeed: fp32 weights,
 * torch.amp's CUDA op lists), op by op beyond the 16-bit count above:
 *   the residual stream is fp32 (the embeddings' fp32 output, then each branch's fp16 output
 *     added to it promotes): ln_1 and ln_2 (layer_norm: an fp32 op) keep fp32 inputs, 4h where
 *     the count has d h: 2 x 2h = 3,072 more
 *   c_attn, c_proj, c_fc (addmm: a 16-bit op) keep their inputs' fp16 casts: as counted
 *   softmax (an fp32 op) keeps its fp32 output, 4 a s where the count has d a s (the .type(value
 *     .dtype) cast after it keeps nothing; dropout's mask and fp16 output as counted): 2 a s =
 *     24,576 more
 *   NewGELUActivation: torch.pow (an fp32 op) keeps its input's fp32 cast, 4I where the count
 *     has x itself, d I; tanh and 1 + tanh are fp32 after it, 4I each where the count has d I
 *     each; 0.5 x stays fp16; the product, fp32, reaches c_proj as its fp16 cast: 6I = 18,432
 *     more
 * = 106,000 + 3,072 + 24,576 + 18,432 = 152,080 bytes a token, 155,729,920 for the 1024; under
 * Korthikanti's count (model_code megatron) 87,552 + 3,072 + 24,576 = 115,200, 117,964,800. */
static void test_autocast_gpt2_block(void)
{
	ModelSpec m;
	CU_ASSERT_EQUAL_FATAL(fx_bundled_model("gpt2", &m), 0);
	ActivShape x = {.s = 1024, .b = 1, .t = 1, .elem_bytes = 2, .autocast = 1};
	CU_ASSERT_DOUBLE_EQUAL(activ_block_bytes(&m, &x, CKPT_NONE), 117964800.0, 0);
	x.hf_eager = 1;
	CU_ASSERT_DOUBLE_EQUAL(activ_block_bytes(&m, &x, CKPT_NONE), 155729920.0, 0);
	/* FlashAttention (SDPA) keeps no scores: the norms' inputs and the GELU's fp32 tensors */
	x.flash = 1;
	double flash = activ_block_bytes(&m, &x, CKPT_NONE);
	x.autocast = 0;
	CU_ASSERT_DOUBLE_EQUAL(flash - activ_block_bytes(&m, &x, CKPT_NONE), 1024 * (3072 + 18432.0),
			       0);
}

/* A Trainer run without DeepSpeed and training_args.fp16 (torch autocast), GPT-2 small (124M,
 * 12 layers), seq 1024, micro-batch 4, on one A100: model states are fp32 ones, 4 + 4 + 8 bytes a
 * parameter with no master copy; autocast's 16-bit weight copies are each block's four matrices
 * (768 x 2304, 768 x 768, 768 x 3072, 3072 x 768: 7,077,888) and the tied embedding the lm_head
 * casts (50,257 x 768 = 38,597,376): 2 x (12 x 7,077,888 + 38,597,376) = 247,064,064 bytes, all
 * held when the forward ends (the autocast cache, then autograd's saved tensors); under the
 * Trainer's gradient_checkpointing a checkpointed block's copies go when the forward ends and
 * its recompute casts again (a second allocation each). The GEMMs run at the fp16 peak; each
 * pass moves 6 bytes a cast element more (fp32 read, 16-bit written). The
 * deepspeed section's own fp16 beside it contradicts it: refused, naming both. */
static void test_autocast_scenario(void)
{
	static const char FMT[] =
		"{%s, \"framework\": \"pytorch\", \"training_args\": {\"fp16\": true,"
		" \"gradient_checkpointing\": %s}, \"deepspeed\": {\"train_micro_batch_size_per_gpu\":"
		" 4%s}, \"cluster\": {\"gpu\": \"A100-80GB\", \"nodes\": 1, \"gpus_per_node\": 1},"
		" \"seq_length\": 1024}";
	Scenario sc;
	Prediction pr;
	if (fx_predictf(&sc, &pr, FMT, fx_model("gpt2"), "false", ""))
		return;
	const double casts = 2 * (12 * 7077888.0 + 38597376.0), P = 124439808;
	const MemPlace *g = &pr.stages[0].mem.place[PLACE_GPU];
	CU_ASSERT_EQUAL(sc.ds.autocast, DT_FP16);
	CU_ASSERT_EQUAL(pr.plan.param_bytes, 4);
	CU_ASSERT_EQUAL(pr.plan.master_bytes, 0);
	CU_ASSERT_DOUBLE_EQUAL(g->cat_peak[CAT_PARAMS], 4 * P, 0);
	CU_ASSERT_DOUBLE_EQUAL(g->cat_peak[CAT_OPTIM], 8 * P, 0);
	CU_ASSERT_DOUBLE_EQUAL(g->cat_peak[CAT_BUFFERS], casts, 0);
	CU_ASSERT_EQUAL(opcost_compute_dtype(&pr.plan), DT_FP16);
	int n = 0, left = -1; /* the blocks' and the head's, all live when the forward ends */
	CU_ASSERT_EQUAL(fx_live_bufs(&pr.stages[0].sched, 0, BUF_AUTOCAST_WEIGHTS, &n, &left), 13);
	CU_ASSERT_EQUAL(n, 13);
	CU_ASSERT_EQUAL(left, 0);
	CU_ASSERT_EQUAL(pr.plan.units[1].cast_elems, 7077888);
	CU_ASSERT_EQUAL(pr.plan.units[13].cast_elems, 38597376);
	/* the casts' traffic: 6 bytes an element a pass (fp32 read, 16-bit written; backward the
	 * reverse), at the A100's 2039 GB/s x 0.9 */
	HwProfile hw;
	hwprofile_default(&sc.cluster.gpu, &hw);
	hw.kernel_issue_s = 0;
	Schedule one;
	sched_init(&one, 0);
	sched_compute(&one, COMP_FWD, 1, pr.plan.units[1].fwd_flops, 0);
	double with = opcost_compute_s(&pr.plan, &hw, &one.ops[0], 0);
	pr.plan.units[1].cast_elems = 0;
	double without = opcost_compute_s(&pr.plan, &hw, &one.ops[0], 0);
	CU_ASSERT_DOUBLE_EQUAL(with - without, 6 * 7077888.0 / (2039e9 * 0.9), 1e-12);
	sched_free(&one);
	fx_free(&sc, &pr);

	if (fx_predictf(&sc, &pr, FMT, fx_model("gpt2"), "true", ""))
		return;
	g = &pr.stages[0].mem.place[PLACE_GPU];
	CU_ASSERT_EQUAL(sc.ckpt, CKPT_FULL);
	CU_ASSERT_DOUBLE_EQUAL(g->cat_peak[CAT_BUFFERS], casts, 0);
	CU_ASSERT_EQUAL(fx_live_bufs(&pr.stages[0].sched, 0, BUF_AUTOCAST_WEIGHTS, &n, &left), 13);
	CU_ASSERT_EQUAL(n, 12 + 1 + 12); /* each block's cast again by its recompute */
	CU_ASSERT_EQUAL(left, 0);
	fx_free(&sc, &pr);

	char path[512], json[2048];
	snprintf(path, sizeof(path), "%s/autocast-both.json", px_test_tmpdir());
	snprintf(json, sizeof(json), FMT, fx_model("gpt2"), "false", ", \"fp16\": {\"enabled\": true}");
	px_test_write_file(path, json);
	PxError err = {0};
	fx_refused(path, NULL, &err);
	PX_ASSERT_HAS(err.msg, "training_args.fp16");
	PX_ASSERT_HAS(err.msg, "torch autocast");

	/* the Trainer's fp16 and bf16 both true: refused naming the file and the key */
	snprintf(path, sizeof(path), "%s/autocast-fp16-bf16.json", px_test_tmpdir());
	snprintf(json, sizeof(json), "{%s, \"framework\": \"pytorch\", \"training_args\":"
		 " {\"fp16\": true, \"bf16\": true}, \"deepspeed\": {\"train_micro_batch_size_per_gpu\":"
		 " 4}, \"cluster\": {\"gpu\": \"A100-80GB\", \"nodes\": 1, \"gpus_per_node\": 1}}",
		 fx_model("gpt2"));
	px_test_write_file(path, json);
	PxError both = {0};
	fx_refused(path, NULL, &both);
	PX_ASSERT_HAS(both.msg, path);
	PX_ASSERT_HAS(both.msg, "training_args: fp16 and bf16 are both true");

	/* priced, but the executor refuses it (parallax run exits 2 on PX_ERR_INPUT) */
	if (fx_predictf(&sc, &pr, FMT, fx_model("gpt2"), "false", "") == 0) {
		PxError run = {0};
		CU_ASSERT_EQUAL(runner_supported(&pr.plan, &run), -1);
		CU_ASSERT_EQUAL(run.code, PX_ERR_INPUT);
		PX_ASSERT_HAS(run.msg, "torch autocast (training_args.fp16 or bf16 with framework "
				       "\"pytorch\") is priced by predict, not run");
		fx_free(&sc, &pr);
	}
}

/* model_code's bad values: one it does not know, and "huggingface" for the executor, which runs
 * its own kernels; each refused as bad input naming the file and the key. */
static void test_model_code_refused(void)
{
	static const char *const bad[][2] = {
		{"\"model_code\": \"jax\"", "model_code"},
		{"\"model_code\": \"huggingface\", \"backend\": \"cpu\"",
		 "model_code \"huggingface\" with backend \"cpu\""},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char path[512], json[2048];
		snprintf(path, sizeof(path), "%s/model-code-%zu.json", px_test_tmpdir(), i);
		snprintf(json, sizeof(json), "{%s, %s, \"deepspeed\": {\"train_micro_batch_size_per_gpu\":"
			 " 1}, \"cluster\": {\"gpu\": \"H200\", \"nodes\": 1, \"gpus_per_node\": 1},"
			 " \"seq_length\": 128}", fx_model("gpt2"), bad[i][0]);
		px_test_write_file(path, json);
		PxError err = {0};
		fx_refused(path, NULL, &err);
		PX_ASSERT_HAS(err.msg, bad[i][1]);
		PX_ASSERT_HAS(err.msg, path);
	}
}

int test_model_register(void)
{
	return PX_ADD_SUITE("model", {"published parameter counts", test_published_counts},
			    {"BERT's classes and their heads", test_bert_heads},
			    {"BertForMaskedLM's head, tensor by tensor", test_bert_mlm_head_bytes},
			    {"the scenario's architecture key", test_architecture_key},
			    {"BertForMaskedLM's and T5's losses in a scenario", test_bert_mlm_loss},
			    {"Megatron's padded vocabulary", test_padded_vocab},
			    {"a causal LM's classifier classes", test_causal_classifiers},
			    {"units sum to the model", test_units_sum_to_model},
			    {"Korthikanti Table 2", test_korthikanti_table2},
			    {"Korthikanti 5as/h values", test_korthikanti_attention_term},
			    {"Korthikanti embedding and output", test_korthikanti_ends},
			    {"scenario activation peak", test_scenario_activations},
			    {"the CUDA executor's padded logits", test_cuda_logits_padding},
			    {"Hugging Face's eager GPT-2 block, op by op", test_hf_eager_gpt2_block},
			    {"Hugging Face's eager Gemma and Gemma 2 blocks, op by op",
			     test_hf_eager_gemma_blocks},
			    {"Gemma 2's head: its norm and soft-capped logits", test_hf_gemma2_head},
			    {"Hugging Face's eager Llama block, op by op", test_hf_eager_llama_block},
			    {"Hugging Face's code in a scenario: the block and the loss",
			     test_hf_eager_scenario},
			    {"model_code's bad values refused", test_model_code_refused},
			    {"torch autocast's GPT-2 block, op by op", test_autocast_gpt2_block},
			    {"torch autocast in a scenario: fp32 states, 16-bit weight copies",
			     test_autocast_scenario});
}
