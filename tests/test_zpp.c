/* ZeRO++ executed: the INT8/INT4 block quantizer on hand-worked blocks (DeepSpeed's rounding
 * and scales), DeepSpeed's qwZ grouping, the simulator's ZeRO++ schedule against hand counts
 * (scales, hpZ's secondary partition, qgZ on one node), and `parallax run` of qwZ, hpZ and qgZ,
 * alone and together, on 4 ranks as 2 nodes of 2 (scenarios/gpt2-mini-cpu-zeropp.json): losses
 * against plain stage 3, every rank's memory and communication against the prediction. */
#include <CUnit/CUnit.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>

#include "../engine/build.h"
#include "../engine/jdoc.h"
#include "../kernels/quant_cpu.h"
#include "../sim/predict.h"
#include "fixtures.h"
#include "run_checks.h"
#include "suites.h"

/* ---- the quantizer ----
 * DeepSpeed's symmetric quantization (csrc/includes/quantization_utils.h, Params<Symmetric>):
 * scale = 2^bits / (2 max|v|) (1.0 when the block is all zero), q = __float2int_rn(v x scale)
 * (round to nearest, ties to even) clamped to [-2^(bits-1), 2^(bits-1) - 1]; the stored scale is
 * 1 / scale; dequantized q x stored. INT4 packs through PackedInt4 {high : 4, low : 4} with
 * high = value 2i + 1 and low = value 2i, the first field in the low bits (GCC/NVCC on little-
 * endian): value 2i in the high nibble. */

/* INT8, one block of 8 (max 1: scale 128, stored 1/128) then a block of 2 zeros. By hand:
 * 1.0 x 128 = 128 -> clamped 127; -1 -> -128; 0.5 -> 64; 2.5/128 x 128 = 2.5 -> 2 (ties to even);
 * 3.5 -> 4; -0.3 x 128 = -38.4 -> -38; 0 -> 0; 1/1024 x 128 = 0.125 -> 0. */
static void test_int8_block(void)
{
	const float v[10] = {1.0f, -1.0f, 0.5f, 2.5f / 128, 3.5f / 128, -0.3f, 0, 1.0f / 1024, 0, 0};
	const int8_t want[10] = {127, -128, 64, 2, 4, -38, 0, 0, 0, 0};
	int8_t q[10];
	float s[2], back[10];
	quant_block_quantize(v, 10, 8, 8, q, s);
	for (int i = 0; i < 10; i++)
		CU_ASSERT_EQUAL(q[i], want[i]);
	CU_ASSERT_EQUAL(s[0], 1.0f / 128);
	CU_ASSERT_EQUAL(s[1], 1.0f); /* an all-zero block: scale 1 */
	quant_block_dequantize(q, s, 10, 8, 8, back);
	CU_ASSERT_EQUAL(back[0], 127.0f / 128); /* the clamp: max/128 off */
	CU_ASSERT_EQUAL(back[1], -1.0f);
	CU_ASSERT_EQUAL(back[3], 2.0f / 128);
	CU_ASSERT_EQUAL(back[5], -38.0f / 128);
	/* every value within half a step (max/256) of itself, but the clamped one (max/128) */
	for (int i = 1; i < 8; i++)
		CU_ASSERT(fabsf(back[i] - v[i]) <= 1.0f / 256);
	CU_ASSERT_EQUAL(quant_bytes(10, 8), 10);
}

/* INT4, 7 values in one block (max 2: scale 16/4 = 4, stored 0.25). By hand: 2 x 4 = 8 -> 7;
 * -8; 0.625 x 4 = 2.5 -> 2; 0.875 x 4 = 3.5 -> 4; -0.375 x 4 = -1.5 -> -2; 0.4 -> 0; 4.
 * Bytes: (7, -8) = 0x78, (2, 4) = 0x24, (-2, 0) = 0xE0, (4, unused 0) = 0x40. */
static void test_int4_block(void)
{
	const float v[7] = {2.0f, -2.0f, 0.625f, 0.875f, -0.375f, 0.1f, 1.0f};
	const uint8_t want[4] = {0x78, 0x24, 0xE0, 0x40};
	const float deq[7] = {1.75f, -2.0f, 0.5f, 1.0f, -0.5f, 0.0f, 1.0f};
	uint8_t q[4] = {0xFF, 0xFF, 0xFF, 0xFF};
	float s[1], back[7];
	quant_block_quantize(v, 7, 8, 4, q, s);
	for (int i = 0; i < 4; i++)
		CU_ASSERT_EQUAL(q[i], want[i]);
	CU_ASSERT_EQUAL(s[0], 0.25f);
	quant_block_dequantize(q, s, 7, 8, 4, back);
	for (int i = 0; i < 7; i++)
		CU_ASSERT_EQUAL(back[i], deq[i]);
	CU_ASSERT_EQUAL(quant_bytes(7, 4), 4);
}

/* DeepSpeed's CUDAQuantizer grouping (partition_parameters.py), by hand: g0 = ceil(n / 8000),
 * then the first g >= g0 with n % (8 g) == 0. 3072: g0 1, 8 | 3072 -> 1; 8192: g0 2, 16 | 8192
 * -> 2; 12400: g0 2, 16 | 12400 (775 x 16) -> 2; 24800: g0 4, 32 | 24800 -> 4; 20000: g0 3,
 * 24 does not divide (20000 = 833 x 24 + 8), 32 does -> 4; 40960: g0 6, 48 and 56 do not, 64
 * does -> 8; 8072 = 8 x 1009 (prime): g0 2, nothing below 1009 -> 1009 groups of 8; 1e6: g0 125,
 * 1000 | 1e6 -> 125; 100 is no multiple of 8: none (DeepSpeed's assertion fails). */
static void test_qwz_groups(void)
{
	static const long long n[] = {3072, 8192, 12400, 24800, 20000, 40960, 8072, 1000000, 100, 0};
	static const long long g[] = {1, 2, 2, 4, 4, 8, 1009, 125, -1, -1};
	for (size_t i = 0; i < sizeof(n) / sizeof(n[0]); i++) {
		if (build_qwz_groups(n[i]) != g[i])
			fprintf(stderr, "\n%lld elements: %lld groups, expected %lld\n", n[i],
				build_qwz_groups(n[i]), g[i]);
		CU_ASSERT_EQUAL(build_qwz_groups(n[i]), g[i]);
	}
}

/* ---- the simulator's ZeRO++ schedule ----
 * scenarios/gpt2-mini-cpu-zeropp.json: V 128, C 64, 2 layers, positions 64, persistence 100,
 * dp 4 as 2 nodes of 2, hpZ 2, 2 micro-batches a step. Partitioned flats (own_gather): the
 * embedding 128 x 64 + 64 x 64 = 12288; a block c_attn 64 x 192 + 192, c_proj 64 x 64, c_fc
 * 64 x 256 + 256, mlp proj 256 x 64: 49600 (its 64-wide biases and norms are persistent); the
 * head's final norm is persistent: 0. Persistent: 2 x (4 x 64 + 2 x 64) + 2 x 64 = 896. */

static int zpp_scenario(const char *set, Scenario *sc, Prediction *pr)
{
	JsonOverrides ov;
	PxError err = {0};
	jov_init(&ov);
	char buf[256];
	snprintf(buf, sizeof(buf), "%s", set ? set : "");
	int rc = 0;
	for (char *t = strtok(buf, " "); t && !rc; t = strtok(NULL, " "))
		rc = jov_add(&ov, t, &err);
	rc = rc || scenario_load(sc, px_test_path("scenarios/gpt2-mini-cpu-zeropp.json"), &ov, &err);
	jov_free(&ov);
	if (!rc && predict_run(sc, pr, &err)) {
		scenario_free(sc);
		rc = -1;
	}
	if (rc)
		fprintf(stderr, "\n%s\n", err.msg);
	return rc;
}

#define ZQ "deepspeed.zero_optimization."
#define NO_QWZ ZQ "zero_quantized_weights=false"
#define NO_HPZ ZQ "zero_hpz_partition_size=1"
#define NO_QGZ ZQ "zero_quantized_gradients=false"

/* qwZ alone: every gather moves its elements as INT8 plus each rank's piece's scales. Per micro-
 * batch forward and backward each gather the embedding (12288: pieces of 3072, 1 group a rank:
 * 12288 + 4 x 4 bytes), both blocks (49600: pieces of 12400, 2 groups: 49600 + 32) and the
 * head's embedding again: 2 x (2 x 12304 + 2 x 49632) = 247744; 2 micro-batches 495488; after
 * the step the persistent 896 bf16 (1792 bytes): 497280 bytes a step (plain bf16: 992000). */
static void test_sim_qwz_scales(void)
{
	Scenario sc;
	Prediction pr;
	if (zpp_scenario(NO_HPZ " " NO_QGZ, &sc, &pr)) {
		CU_FAIL("load");
		return;
	}
	CU_ASSERT_EQUAL(pr.stages[0].traffic.payload_bytes[COLL_ALL_GATHER], 497280);
	predict_free(&pr);
	scenario_free(&sc);
}

/* hpZ with qwZ: backward gathers the secondary partition over the hpz group of 2, quantized
 * too (DeepSpeed's all_gather_coalesced takes the quantize flag for either partition): a block
 * 49600 INT8 + 2 ranks x 4 groups (pieces of 24800) x 4 bytes = 49632, the embedding 12288 +
 * 2 x 1 x 4 = 12296. The second micro-batch's forward gathers from it too (stage3.py keeps the
 * secondary tensor from the first forward until the step's invalidate_secondary_tensor): the
 * step's gathers are the first forward's over dp (2 x 12304 + 2 x 49632 = 123872), three passes
 * over hpz (3 x (2 x 12296 + 2 x 49632) = 371568) and the persistent 1792 bytes: 497232. The
 * secondary partition holds each unit's flat once over 2 ranks, the tied head reading the
 * embedding's: (12288 + 2 x 49600) / 2 = 55744 elements (the head's gather of the embedding
 * counted again gave 61888). */
static void test_sim_hpz(void)
{
	Scenario sc;
	Prediction pr;
	if (zpp_scenario(NO_QGZ, &sc, &pr)) {
		CU_FAIL("load");
		return;
	}
	CU_ASSERT_EQUAL(pr.plan.stages[0].secondary_elems, 55744);
	const Schedule *s = &pr.stages[0].sched;
	int hpz = 0, blocks = 0;
	for (int i = 0; i < s->n; i++) {
		const Op *op = &s->ops[i];
		if (op->kind != OP_COLL || op->group != GROUP_HPZ)
			continue;
		hpz++;
		CU_ASSERT_EQUAL(op->elem_bytes, 1);
		CU_ASSERT(op->slice >= 0); /* where its piece lies in the secondary partition */
		if (op->unit == 1 || op->unit == 2) {
			blocks++;
			CU_ASSERT_EQUAL(op->bytes, 49632);
			CU_ASSERT_EQUAL(s->slices[op->slice].part_off, 6144 + (op->unit - 1) * 24800);
		}
	}
	/* each pass: the embedding, both blocks and the head's embedding; the first forward's are
	 * over dp */
	CU_ASSERT_EQUAL(hpz, 12);
	CU_ASSERT_EQUAL(blocks, 6);
	CU_ASSERT_EQUAL(pr.stages[0].traffic.payload_bytes[COLL_ALL_GATHER], 497232);
	predict_free(&pr);
	scenario_free(&sc);
}

/* hpZ with the parameters offloaded to the host (offload_param.device cpu): DeepSpeed keeps the
 * secondary partition on the offload device too (partition_parameters.py _partition_param_sec:
 * torch.empty on remote_device, pinned), and moves what each gather reads to the device first
 * (param.ds_tensor.to(device), ds_secondary_tensor.to(device)). Host parameters: the partition
 * (the embedding's 12288 / 4 + two blocks' 49600 / 4 + the persistent 896 / 4 = 28096 elements)
 * and the secondary partition (55744) in bf16: (28096 + 55744) x 2 = 167680 bytes; none on the
 * device but the persistent 896 padded to 4. Host to device a step: the first forward's pieces
 * of the primary partition (3072 + 2 x 12400 + the head's 3072 = 30944 elements), then three
 * passes of the secondary's halves (6144 + 2 x 24800 + 6144 = 61888 each): (30944 + 3 x 61888)
 * x 2 = 433216 bytes; after the update on the device, the partition back to the host (28096
 * x 2 bytes device to host). The gathers themselves are test_sim_hpz's. With the parameters on NVMe,
 * hpZ is refused (DeepSpeed's torch.empty would be given device "nvme"). */
static void test_sim_hpz_offload(void)
{
	Scenario sc;
	Prediction pr;
	if (zpp_scenario(NO_QGZ " " ZQ "offload_param.device=cpu", &sc, &pr)) {
		CU_FAIL("load");
		return;
	}
	const MemResult *mem = &pr.stages[0].mem;
	CU_ASSERT_EQUAL(mem->end_bytes[PLACE_CPU], 167680);
	/* on the device: the persistent tensors and every unit's gathered flat at once (the
	 * head's embedding too: max_live_parameters 1e9) */
	CU_ASSERT_EQUAL(mem->place[PLACE_GPU].cat_peak[CAT_PARAMS],
			(896 + 2 * 12288 + 2 * 49600) * 2);
	CU_ASSERT_EQUAL(pr.stages[0].traffic.copy_bytes[COPY_H2D], 433216);
	/* the device's optimizer writes the updated partition back to the host */
	CU_ASSERT_EQUAL(pr.stages[0].traffic.copy_bytes[COPY_D2H], 28096 * 2);
	CU_ASSERT_EQUAL(pr.stages[0].traffic.payload_bytes[COLL_ALL_GATHER], 497232);
	predict_free(&pr);
	scenario_free(&sc);
	PxError err = {0};
	JsonOverrides ov;
	jov_init(&ov);
	CU_ASSERT_EQUAL(jov_add(&ov, ZQ "offload_param.device=nvme", &err), 0);
	CU_ASSERT_EQUAL(jov_add(&ov, ZQ "offload_param.nvme_path=/tmp", &err), 0);
	fx_refused(px_test_path("scenarios/gpt2-mini-cpu-zeropp.json"), &ov, &err);
	jov_free(&ov);
	PX_ASSERT_HAS(err.msg, "gpt2-mini-cpu-zeropp.json: zero_hpz_partition_size = 2 with "
			       "offload_param.device \"nvme\"");
}

/* ZeRO-3 with the optimizer on the host adds each reduced slice to the host's gradient partition
 * on the device (stage3.py partition_grads: grad_buffer.to(device), add_, copy_ back): a device
 * buffer of the slice in the accumulation dtype (bf16 here) lives around each copy to the host.
 * Plain stage 3 on the 4 ranks: per micro-batch the two blocks' slices (49600 / 4 x 2 = 24800
 * bytes each), the embedding's with the tied head's gradients summed in (12288 / 4 x 2 = 6144)
 * and the persistent tensors' (896 / 4 x 2 = 448): each buffer the size of the copy it serves,
 * allocated just before it and freed just after. */
static void test_sim_offload_grad_copy(void)
{
	Scenario sc;
	Prediction pr;
	if (zpp_scenario(NO_QWZ " " NO_HPZ " " NO_QGZ " " ZQ "offload_optimizer.device=cpu", &sc,
			 &pr)) {
		CU_FAIL("load");
		return;
	}
	const Schedule *s = &pr.stages[0].sched;
	int n[3] = {0}; /* 24800, 6144, 448 */
	for (int i = 0; i + 2 < s->n; i++) {
		const Op *a = &s->ops[i];
		if (a->kind != OP_ALLOC || a->what != BUF_OFFLOAD_GRAD_COPY)
			continue;
		CU_ASSERT_EQUAL(a->place, PLACE_GPU);
		const Op *c = &s->ops[i + 1], *f = &s->ops[i + 2];
		CU_ASSERT(c->kind == OP_COPY && c->sub == COPY_D2H && c->role == ROLE_GRAD_REDUCE);
		CU_ASSERT_EQUAL(c->bytes, a->bytes);
		CU_ASSERT(f->kind == OP_FREE && f->buf == a->buf);
		n[0] += a->bytes == 24800, n[1] += a->bytes == 6144, n[2] += a->bytes == 448;
		CU_ASSERT(a->bytes == 24800 || a->bytes == 6144 || a->bytes == 448);
	}
	CU_ASSERT_EQUAL(n[0], 2);
	CU_ASSERT_EQUAL(n[1], 1);
	CU_ASSERT_EQUAL(n[2], 1);
	predict_free(&pr);
	scenario_free(&sc);
}

/* qgZ on 2 nodes of 2: per reduction of E elements (slices of c = E/4, in groups of C = 64) an
 * all-to-all in the node of E/2 bytes + 4 x ceil(c/64) scales, and one across nodes of E/4 bytes
 * + 2 x ceil(c/64). Embedding E 12288 (c 3072, 48 groups): 6144 + 768 and 3072 + 384; a block
 * 49600 (c 12400, 194 groups): 24800 + 3104 and 12400 + 1552; the persistent 896 (c 224, 4):
 * 448 + 64 and 224 + 32. Per micro-batch 94848 bytes, a step 189696, no reduce-scatter. On one
 * node DeepSpeed reduce-scatters (stage3.py: the all-to-all only when num_nodes > 1). */
static void test_sim_qgz(void)
{
	Scenario sc;
	Prediction pr;
	if (zpp_scenario(NO_QWZ " " NO_HPZ, &sc, &pr)) {
		CU_FAIL("load");
		return;
	}
	CU_ASSERT_EQUAL(pr.stages[0].traffic.payload_bytes[COLL_ALL_TO_ALL], 189696);
	CU_ASSERT_EQUAL(pr.stages[0].traffic.payload_bytes[COLL_REDUCE_SCATTER], 0);
	predict_free(&pr);
	scenario_free(&sc);
	if (zpp_scenario(NO_QWZ " " NO_HPZ " cluster.nodes=1 cluster.gpus_per_node=4", &sc, &pr)) {
		CU_FAIL("load");
		return;
	}
	CU_ASSERT_EQUAL(pr.stages[0].traffic.payload_bytes[COLL_ALL_TO_ALL], 0);
	/* bf16 gradients: 2 x (12288 + 2 x 49600 + 896) x 2 bytes */
	CU_ASSERT_EQUAL(pr.stages[0].traffic.payload_bytes[COLL_REDUCE_SCATTER], 449536);
	predict_free(&pr);
	scenario_free(&sc);
}

/* ---- executed on 4 ranks, 2 nodes of 2 ---- */

static const char *zpp_base(void)
{
	static char base[1024];
	snprintf(base, sizeof(base), "run '%s' --no-db --json",
		 px_test_path("scenarios/gpt2-mini-cpu-zeropp.json"));
	return base;
}

#define PLAIN "--set " NO_QWZ " --set " NO_HPZ " --set " NO_QGZ

/* Losses against plain stage 3 on the same 4 ranks, with the bounds the quantization gives:
 * - hpZ moves the same values (the secondary partition is a copy of the gathered ones): equal to
 *   the bit.
 * - qwZ: each weight the forward and backward read is off by at most half a step of its group's
 *   max/128 (max/256; max/128 where the clamp takes +max to 127/128 of it): relative to the
 *   weights' scale at most 1/128, which bounds the loss's relative change: 1/128 a step
 *   (measured 5e-4).
 * - qgZ: the first loss is computed before any gradient: equal to the bit. After, each gradient
 *   element travels as INT4 twice (inside the node and across), each off by at most half of
 *   its group's max/8 (and max/8 at the clamp): at most 1/4 of the group's max in all. AdamW
 *   normalises the update, so a step moves the weights by as much as without, in a direction off
 *   by at most that fraction: the loss's drop since step 1 changes by at most a quarter of it
 *   (measured under 1%).
 * - All three: the two bounds added. */
static void test_run_losses(void)
{
	enum { S = PX_LOSS_STEPS };
	double ref[S], got[S];
	const char *b = zpp_base();
	CU_ASSERT_EQUAL_FATAL(px_run_losses(b, 4, S, PLAIN, ref), S);
	CU_ASSERT(ref[S - 1] < 0.95 * ref[0]); /* it learns */
	CU_ASSERT_EQUAL_FATAL(px_run_losses(b, 4, S, "--set " NO_QWZ " --set " NO_QGZ, got), S);
	for (int s = 0; s < S; s++)
		CU_ASSERT_EQUAL(got[s], ref[s]);
	static const char *const sets[3] = {"--set " NO_HPZ " --set " NO_QGZ,
					    "--set " NO_QWZ " --set " NO_HPZ, ""};
	static const int qw[3] = {1, 0, 1}, qg[3] = {0, 1, 1};
	for (int k = 0; k < 3; k++) {
		CU_ASSERT_EQUAL_FATAL(px_run_losses(b, 4, S, sets[k], got), S);
		if (!qw[k])
			CU_ASSERT_EQUAL(got[0], ref[0]);
		for (int s = 0; s < S; s++) {
			double bound = qw[k] * ref[s] / 128 + qg[k] * (ref[0] - ref[s]) / 4;
			if (fabs(got[s] - ref[s]) > bound || (got[s] == ref[s] && s > 0))
				fprintf(stderr, "\n'%s' step %d: loss %.8g, plain %.8g, bound %.3g\n",
					sets[k], s + 1, got[s], ref[s], bound);
			CU_ASSERT(fabs(got[s] - ref[s]) <= bound);
			if (s > 0) /* the quantization did act */
				CU_ASSERT(got[s] != ref[s]);
		}
	}
}

static double measured(sqlite3 *db, const char *name)
{
	return px_run_metric(db, name, "measured", 0);
}

/* Every rank's memory by category and communication per collective equal to the prediction
 * (px_run_measured), for each of qwZ, hpZ, qgZ and all three; and the hand counts of
 * test_sim_qwz_scales and test_sim_qgz as measured: qwZ's all-gathers issue 497280 bytes a
 * step, and send 3/4 of the 992000 - 497280 bytes less than plain stage 3's (a ring all-gather
 * over 4 ranks sends 3 of its 4 pieces; the other collectives are the same): 371040; qgZ's
 * all-to-alls 189696 and no reduce-scatter. */
static void test_run_measured(void)
{
	char args[2048];
	static const char *const sets[4] = {"--set " NO_HPZ " --set " NO_QGZ,
					    "--set " NO_QWZ " --set " NO_QGZ,
					    "--set " NO_QWZ " --set " NO_HPZ, ""};
	snprintf(args, sizeof(args), "run '%s' --ranks 4 --steps 2 %s",
		 px_test_path("scenarios/gpt2-mini-cpu-zeropp.json"), PLAIN);
	sqlite3 *db = px_run_measured(args, 4);
	double plain_wire = measured(db, "comm.wire_bytes");
	sqlite3_close(db);
	for (int k = 0; k < 4; k++) {
		snprintf(args, sizeof(args), "run '%s' --ranks 4 --steps 2 %s",
			 px_test_path("scenarios/gpt2-mini-cpu-zeropp.json"), sets[k]);
		db = px_run_measured(args, 4);
		if (k == 0) {
			CU_ASSERT_EQUAL(measured(db, "comm.all_gather_bytes"), 497280);
			CU_ASSERT_EQUAL(plain_wire - measured(db, "comm.wire_bytes"), 371040);
		}
		if (k == 2) {
			CU_ASSERT_EQUAL(measured(db, "comm.all_to_all_bytes"), 189696);
			CU_ASSERT_EQUAL(measured(db, "comm.reduce_scatter_bytes"), 0);
		}
		sqlite3_close(db);
	}
}

/* With tensor parallelism, tp 2 x dp 4 on 2 nodes of 4 (8 ranks): ZeRO++'s groups are formed
 * inside each data-parallel group (the ranks of one tensor-parallel index), so hpZ's secondary
 * partition spans a node's 2 data-parallel ranks and qgZ's all-to-alls run among them, then
 * across the nodes. In fp32, against plain stage 3 with the same layout the bounds of
 * test_run_losses hold (hpZ alone to the bit; all three within the sum of qwZ's and qgZ's), and
 * every rank's memory and communication equal the prediction; in bf16 (the scenario's own type)
 * hpZ alone is plain stage 3 to the bit too, and all three's memory and communication equal the
 * prediction. */
static void test_run_with_tp(void)
{
	enum { S = PX_LOSS_STEPS };
	const char *tp = "--set parallelism.tp=2 --set deepspeed.bf16.enabled=false --set "
			 "cluster.nodes=2 --set cluster.gpus_per_node=4";
	char extra[1024], args[2048];
	double ref[S], got[S];
	const char *b = zpp_base();
	snprintf(extra, sizeof(extra), "%s %s", tp, PLAIN);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(b, 8, S, extra, ref), S);
	CU_ASSERT(ref[S - 1] < 0.95 * ref[0]);
	snprintf(extra, sizeof(extra), "%s --set " NO_QWZ " --set " NO_QGZ, tp);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(b, 8, S, extra, got), S);
	for (int s = 0; s < S; s++)
		CU_ASSERT_EQUAL(got[s], ref[s]);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(b, 8, S, tp, got), S);
	for (int s = 0; s < S; s++) {
		double bound = ref[s] / 128 + (ref[0] - ref[s]) / 4;
		if (fabs(got[s] - ref[s]) > bound)
			fprintf(stderr, "\ntp 2: step %d: loss %.8g, plain %.8g, bound %.3g\n", s + 1,
				got[s], ref[s], bound);
		CU_ASSERT(fabs(got[s] - ref[s]) <= bound);
		if (s > 0)
			CU_ASSERT(got[s] != ref[s]);
	}
	snprintf(args, sizeof(args), "run '%s' --ranks 8 --steps 2 %s",
		 px_test_path("scenarios/gpt2-mini-cpu-zeropp.json"), tp);
	sqlite3 *db = px_run_measured(args, 8);
	CU_ASSERT(measured(db, "comm.all_to_all_bytes") > 0); /* qgZ ran */
	sqlite3_close(db);

	const char *tp16 = "--set parallelism.tp=2 --set cluster.nodes=2 --set cluster.gpus_per_node=4";
	enum { S16 = 4 };
	snprintf(extra, sizeof(extra), "%s %s", tp16, PLAIN);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(b, 8, S16, extra, ref), S16);
	snprintf(extra, sizeof(extra), "%s --set " NO_QWZ " --set " NO_QGZ, tp16);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(b, 8, S16, extra, got), S16);
	for (int s = 0; s < S16; s++)
		CU_ASSERT_EQUAL(got[s], ref[s]);
	snprintf(args, sizeof(args), "run '%s' --ranks 8 --steps 2 %s",
		 px_test_path("scenarios/gpt2-mini-cpu-zeropp.json"), tp16);
	db = px_run_measured(args, 8);
	CU_ASSERT(measured(db, "comm.all_to_all_bytes") > 0);
	sqlite3_close(db);
}

/* What the executor does not run with ZeRO++ is refused, naming it, exit 2. */
static void test_run_refuses(void)
{
	char args[1024], text[8192];
	snprintf(args, sizeof(args), "run '%s' --no-db --ranks 4 --backend cuda",
		 px_test_path("scenarios/gpt2-mini-cpu-zeropp.json"));
	CU_ASSERT_EQUAL(px_test_run_release(args, 60, text, sizeof(text)), 2);
	PX_ASSERT_HAS(text, "the executor runs ZeRO++ with data and tensor parallelism on backend");
	/* hpZ with the parameters on NVMe, which DeepSpeed cannot allocate (test_sim_hpz_offload) */
	snprintf(args, sizeof(args), "predict '%s' --no-db --set " ZQ "offload_param.device=nvme "
		 "--set " ZQ "offload_param.nvme_path=/tmp",
		 px_test_path("scenarios/gpt2-mini-cpu-zeropp.json"));
	CU_ASSERT_EQUAL(px_test_run_release(args, 60, text, sizeof(text)), 2);
	PX_ASSERT_HAS(text, "zero_hpz_partition_size = 2 with offload_param.device \"nvme\"");
}

/* ZeRO++ with the optimizer offloaded (DeepSpeed's CPU Adam over the host's fp32 partition), all
 * three of qwZ, hpZ and qgZ, 4 ranks on 2 nodes of 2: the reduced slices reach the host by the
 * schedule's copies, qgZ's too (from where a reduce-scatter would leave them), so in fp32 the
 * losses equal those with the optimizer on the device to the bit; every rank's memory and
 * communication equal the prediction, and the optimizer's states are on the host. Tried on
 * purpose: zeroing the persistent gradients as soon as qgZ has reduced them (as on the device,
 * where the slice went to the partition first) leaves the host without them, and the losses part
 * from step 2 (4.8055 against 4.8139 at 3 steps with only qgZ). */
static void test_run_offload(void)
{
	enum { S = 6 };
	const char *off = "--set " ZQ "offload_optimizer.device=cpu";
	double dev[S], host[S];
	const char *b = zpp_base();
	CU_ASSERT_EQUAL_FATAL(px_run_losses(b, 4, S, "--set deepspeed.bf16.enabled=false", dev), S);
	char extra[512], args[1024];
	snprintf(extra, sizeof(extra), "--set deepspeed.bf16.enabled=false %s", off);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(b, 4, S, extra, host), S);
	for (int s = 0; s < S; s++)
		CU_ASSERT_EQUAL(host[s], dev[s]);
	snprintf(args, sizeof(args), "run '%s' --ranks 4 --steps 2 %s",
		 px_test_path("scenarios/gpt2-mini-cpu-zeropp.json"), off);
	sqlite3 *db = px_run_measured(args, 4);
	CU_ASSERT(measured(db, "comm.all_to_all_bytes") > 0); /* qgZ ran */
	CU_ASSERT(measured(db, "memory.cpu.optimizer_bytes") > 0);
	CU_ASSERT_EQUAL(measured(db, "memory.gpu.optimizer_bytes"), 0);
	sqlite3_close(db);
}

/* ZeRO++ with the parameters offloaded too. To the host, all three of qwZ, hpZ and qgZ: the
 * gathers read the host's partition and hpZ's secondary partition lies on the host (as
 * DeepSpeed keeps it), the same values as on the device, so in fp32 the losses equal those with
 * the parameters on the device to the bit; every rank's memory and communication equal the
 * prediction, the secondary partition in the host's parameters (test_sim_hpz_offload's 167680
 * bytes). Past offload_param.max_in_cpu (qwZ and qgZ: hpZ is refused there), each rank's piece
 * comes from its swap file and the losses are again the same to the bit. */
static void test_run_param_offload(void)
{
	enum { S = 4 };
	const char *fp32 = "--set deepspeed.bf16.enabled=false";
	double dev[S], host[S];
	char extra[1024], args[1024];
	const char *b = zpp_base();
	CU_ASSERT_EQUAL_FATAL(px_run_losses(b, 4, S, fp32, dev), S);
	snprintf(extra, sizeof(extra), "%s --set " ZQ "offload_param.device=cpu --set "
		 ZQ "offload_optimizer.device=cpu", fp32);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(b, 4, S, extra, host), S);
	for (int s = 0; s < S; s++)
		CU_ASSERT_EQUAL(host[s], dev[s]);
	snprintf(args, sizeof(args), "run '%s' --ranks 4 --steps 2 --set "
		 ZQ "offload_param.device=cpu", px_test_path("scenarios/gpt2-mini-cpu-zeropp.json"));
	sqlite3 *db = px_run_measured(args, 4);
	CU_ASSERT_EQUAL(measured(db, "memory.cpu.params_bytes"), 167680);
	CU_ASSERT(measured(db, "comm.all_to_all_bytes") > 0); /* qgZ ran */
	sqlite3_close(db);

	const char *nvme_dir = px_test_tmpdir();
	snprintf(extra, sizeof(extra), "%s --set " NO_HPZ " --set " ZQ "offload_param.device=cpu",
		 fp32);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(b, 4, S, extra, dev), S);
	snprintf(extra, sizeof(extra), "%s --set " NO_HPZ " --set " ZQ "offload_param.device=nvme "
		 "--set " ZQ "offload_param.nvme_path=%s --set " ZQ "offload_param.max_in_cpu=3000 "
		 "--set " ZQ "offload_param.buffer_size=20000", fp32, nvme_dir);
	CU_ASSERT_EQUAL_FATAL(px_run_losses(b, 4, S, extra, host), S);
	for (int s = 0; s < S; s++)
		CU_ASSERT_EQUAL(host[s], dev[s]);
}

int test_zpp_register(void)
{
	return PX_ADD_SUITE("zpp", {"INT8 block: DeepSpeed's rounding and scale", test_int8_block},
			    {"INT4 block: values, scale, packing", test_int4_block},
			    {"qwZ groups as DeepSpeed's quantizer", test_qwz_groups},
			    {"simulator: qwZ scales by hand", test_sim_qwz_scales},
			    {"simulator: hpZ secondary and quantized gathers", test_sim_hpz},
			    {"simulator: hpZ with the parameters on the host", test_sim_hpz_offload},
			    {"simulator: ZeRO-3 offload's device copy of each slice", test_sim_offload_grad_copy},
			    {"simulator: qgZ all-to-alls, one node reduce-scatters", test_sim_qgz},
			    {"run: losses against plain stage 3", test_run_losses, PX_RELEASE_RUN},
			    {"run: measured equals predicted, hand counts", test_run_measured, PX_RELEASE_RUN},
			    {"run: with tensor parallelism, fp32 and bf16", test_run_with_tp, PX_RELEASE_RUN},
			    {"run: ZeRO++ refusals", test_run_refuses, PX_RELEASE_RUN},
			    {"run: with the optimizer offloaded", test_run_offload, PX_RELEASE_RUN},
			    {"run: with the parameters offloaded", test_run_param_offload,
			     PX_RELEASE_RUN});
}
