/* traffic: what a schedule moves per optimizer step: collective payloads (nccl-tests' "size"
 * convention: the whole array, count x nranks x type size for gathers and scatters), the bytes each
 * rank sends, split into traffic inside a node (NVLink) and between nodes (network) from where the
 * group's members sit, host/NVMe copies and FLOPs. It does not time anything. */
#ifndef PX_SIM_TRAFFIC_H
#define PX_SIM_TRAFFIC_H

#include "../engine/parallel.h"
#include "../engine/schedule.h"

typedef struct Traffic {
	double payload_bytes[N_COLLS];
	double wire_bytes[N_COLLS];        /* sent by one rank */
	double group_payload_bytes[N_GROUPS];
	double group_wire_bytes[N_GROUPS];
	long long n_colls[N_COLLS];
	double wire_total_bytes;
	double intra_node_bytes, inter_node_bytes; /* wire bytes one rank sends, by link class */
	double node_egress_bytes;          /* what a whole node sends to other nodes: every GPU of
					      a node runs the same ops, so gpus_per_node x inter */
	double copy_bytes[N_COPIES];
	double flops[N_COMPS];
	double flops_total;
} Traffic;

/* Bytes one rank sends for a collective of `payload` bytes over n ranks with ring algorithms:
 * all-reduce 2(n-1)/n, reduce-scatter, all-gather and all-to-all (n-1)/n, broadcast and
 * point-to-point 1, a receive 0 (nccl-tests doc/PERFORMANCE.md bus-bandwidth factors). */
double traffic_ring_wire_bytes(CollKind kind, double payload, int n);

/* Test hook: traffic_ring_wire_bytes multiplies what it returns by scale (1, the default: the
 * formula as stated). A test makes the simulator wrong on purpose with it, to check that measured
 * figures do not follow (exec/comm.h: counted wire bytes come from the transport). */
void traffic_test_set_wire_scale(double scale);

/* Split one collective's wire bytes into intra- and inter-node for a group spread as `span`:
 * a ring crosses nodes on span.nodes of its n links; an all-to-all sends (n - per_node)/n of its
 * data off the node; hierarchical and tree all-reduce / all-gather / reduce-scatter run inside
 * the node first and move 1/per_node of the data between nodes. */
void traffic_split(CollKind kind, double payload, GroupSpan span, CollAlgo algo, double *intra,
		   double *inter);

/* Payload of every collective kind together (receives excluded: the send counts the message). */
double traffic_payload_total(const Traffic *t);

/* Sum one step (set-up excluded; micro-batch loops multiplied out); spans give each group's
 * placement (indexed by CommGroup). */
int sim_traffic(const Schedule *s, const GroupSpan *spans, CollAlgo algo, long long gpus_per_node,
		Traffic *t, PxError *err);

#endif
