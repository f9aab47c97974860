/*
 * cli/cmd_plan.c — `flatshard plan`: per-device memory, communication and an estimated step
 * time for any model on any cluster, from the same plan function the engine allocates by.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "common.h"
#include "flatshard/estimate.h"
#include "flatshard/train.h"

static const fs_command_help plan_help = {
    .usage = "flatshard plan [options]",
    .description =
        "Plans a training run without running it: per-device memory by category (the shard\n"
        "plan the engine allocates by, exact for flatshard on this machine), whether it fits a\n"
        "device, the collectives of one step with their bytes, and an estimated step time\n"
        "(GEMM FLOPs over the GEMM rate, attention's T^2 FLOPs over the attention rate, the\n"
        "bytes of the memory-bound kernels and the optimizer over the memory bandwidth;\n"
        "collective bytes over the link's bus bandwidth; what the schedule overlaps). The\n"
        "model is a preset (tiny, small, llama2-7b, llama2-13b, llama2-70b, llama3-8b,\n"
        "llama3-70b) or a config.json; the device a published preset (figures and sources in\n"
        "docs/planner.md) or this-machine: this machine, one core per rank, measured by a\n"
        "short calibration of the kernels each precision runs (a block's GEMMs forward and\n"
        "backward, fp32 and bf16; attention, fp32 and bf16; AdamW; a block forward and\n"
        "backward alone and with every core busy; the CPU ring between 2 ranks), cached in\n"
        "$XDG_CACHE_HOME/flatshard or ~/.cache/flatshard; ranks that fill the cores are\n"
        "estimated slower by the block's busy / alone time. The output says where the figures\n"
        "came from. On this-machine the memory is the RAM, shared by the min(W, cores) ranks\n"
        "on it: a plan fits when their totals do together. --ckpt-layers auto finds the\n"
        "fewest checkpointed blocks that fit.\n"
        "--shard-group auto plans every group size G that divides W (hybrid sharding: shard\n"
        "within groups of G, all-reduce the gradient shards over the W/G replicas), each with\n"
        "its own --ckpt-layers, prints a table of them and the full plan of the fastest that\n"
        "fits. The presets' interconnect is NCCL bus bandwidth: NVLink inside a node of 8, one\n"
        "InfiniBand NIC per GPU between nodes. On a preset (a GPU) with W > 1 the memory has a\n"
        "category of its own, nccl: the device memory of NCCL's communicators beside the\n"
        "engine's allocator (flatshard's barrier int32 exactly; NCCL's ring buffers estimated\n"
        "from its default sizes, 32 channels of 9,633,792 bytes per communicator).",
    .epilog = "examples:\n"
              "  flatshard plan --model llama2-70b --world 256 --seq 4096 --device a100-80gb --ckpt-layers auto\n"
              "  flatshard plan --model llama3-70b --world 256 --seq 4096 --device h100-80gb --ckpt-layers auto --shard-group auto\n"
              "  flatshard plan --model small --world 2 --batch 4 --seq 256 --device this-machine",
};

static const char *const strategy_choices[] = {"ddp", "zero1", "zero2", "zero3-param", "yafsdp", NULL};
static const char *const precision_choices[] = {"fp32", "bf16", NULL};
static const char *const device_choices[] = {"this-machine", "a100-80gb", "h100-80gb", "h200", NULL};

typedef struct planned {
    fs_plan plan;
    fs_layout layout;
    uint64_t bytes[FS_MEM_N_CATEGORIES], total; /* exact: a double would round above 2^53 */
    uint64_t nccl; /* a GPU's NCCL communicators (fs_plan_nccl_bytes), in total; 0 on the CPU */
} planned;

/* The plan of rank 0, its activations at the device's bytes per element (the plan's are
 * fp32, whole multiples of 64 bytes, so the scaling is exact), and on a GPU the device memory
 * NCCL's communicators take beside the engine's allocator. */
static fs_status make_plan(planned *p, const fs_llama_config *mc, const fs_train_config *tc, int world,
                           const fs_hardware *hw) {
    FS_TRY(fs_trainer_plan(&p->plan, &p->layout, mc, tc, world, 0));
    p->total = 0;
    for (int k = 0; k < FS_MEM_N_CATEGORIES; k++) {
        uint64_t b = p->plan.bytes[k];
        if (k == FS_MEM_ACTIVATIONS && hw->activation_bytes != 4) {
            /* every element at the device's size: scale the plan of the fp32 layout (the bf16
             * route's arrays are already 2 bytes, fs_plan_config.bf16_route) */
            size_t act = 0, tokens = 0;
            fs_acts_bytes(&p->layout, tc->batch, tc->seq, tc->ckpt_layers, 0, &act, &tokens);
            b = (uint64_t)act / 4 * (uint64_t)hw->activation_bytes;
        }
        /* the plan is this machine's CPU: a preset's GPU has not its GEMM staging (oneDNN's,
         * kernels.h), and docs/planner.md's formulas leave the GPU's GEMM scratch out */
        if (k == FS_MEM_OTHER && hw->origin == FS_HW_PUBLISHED) b -= p->plan.cfg.device_bytes;
        p->bytes[k] = b;
        p->total += b;
    }
    p->nccl = tc->device == FS_DEVICE_CUDA ? fs_plan_nccl_bytes(&p->plan) : 0;
    p->total += p->nccl;
    return FS_OK;
}

static void free_plan(planned *p) {
    fs_plan_free(&p->plan);
    fs_layout_free(&p->layout);
}

/* Whether `sharing` ranks of this total fit `capacity`: the device memory of each (sharing 1,
 * a GPU) or the RAM of a host that many ranks share (this-machine,
 * fs_hardware_ranks_sharing_memory). In double: the product may pass 2^64. */
static int fits_memory(uint64_t total, int sharing, double capacity) {
    return (double)total * (double)sharing <= capacity;
}

/* The plan of tc (with auto_ckpt, the fewest checkpointed blocks that fit `capacity` shared by
 * `sharing` ranks, or all of them: tc->ckpt_layers says which; *needed is -1 when even all do
 * not fit). */
static fs_status plan_fitting(planned *p, const fs_llama_config *mc, fs_train_config *tc, int world,
                              const fs_hardware *hw, int auto_ckpt, double capacity, int sharing,
                              int64_t *needed) {
    *needed = -1;
    if (auto_ckpt) tc->ckpt_layers = 0;
    fs_status st = make_plan(p, mc, tc, world, hw);
    /* auto: the fewest checkpointed blocks that fit (memory falls as blocks are added) */
    for (int64_t n = 0; st == FS_OK && auto_ckpt && n <= mc->num_hidden_layers; n++) {
        if (n > 0) {
            free_plan(p);
            tc->ckpt_layers = n;
            st = make_plan(p, mc, tc, world, hw);
        }
        if (st == FS_OK && fits_memory(p->total, sharing, capacity)) {
            *needed = n;
            break;
        }
    }
    return st;
}

/* One row of --shard-group auto. */
typedef struct group_row {
    int group;
    fs_status status; /* FS_OK, or why this G cannot be planned (message below) */
    char error[256];
    int64_t ckpt_layers;
    uint64_t total;
    int fits;
    fs_step_estimate est;
} group_row;

int fs_cmd_plan(int argc, char **argv) {
    const char *model = "small", *strategy = "yafsdp", *precision = "bf16", *device = "this-machine";
    const char *ckpt = "0", *shard_group_arg = "0";
    int64_t world = 2, batch = 1, seq = 256, grad_accum = 1, device_mem = 0;
    int json = 0, recalibrate = 0, fp32_grad_wire = 0;
    const fs_opt opts[] = {
        {"model", 'm', FS_OPT_STRING, &model, "PRESET|FILE", "model preset or a Hugging Face config.json", NULL, 0, 0},
        {"world", 'w', FS_OPT_INT, &world, "W", "ranks (devices)", NULL, 1, 1 << 20},
        {"shard-group", 0, FS_OPT_STRING, &shard_group_arg, "G|auto", "hybrid sharding: shard within groups of G consecutive ranks, replicate across the W/G groups (G divides W; 0: G = W); auto: plan every G dividing W and show the fastest that fits", NULL, 0, 0},
        {"batch", 'b', FS_OPT_INT, &batch, "B", "sequences per micro-batch per device", NULL, 1, 1 << 20},
        {"seq", 't', FS_OPT_INT, &seq, "T", "tokens per sequence", NULL, 1, 1 << 24},
        {"grad-accum", 0, FS_OPT_INT, &grad_accum, "K", "micro-batches per optimizer step", NULL, 1, 1 << 20},
        {"ckpt-layers", 0, FS_OPT_STRING, &ckpt, "N|auto", "checkpointed blocks, or the fewest that fit the device", NULL, 0, 0},
        {"strategy", 's', FS_OPT_STRING, &strategy, "NAME", "what is sharded", strategy_choices, 0, 0},
        {"precision", 0, FS_OPT_STRING, &precision, "P", "weights in the buffers and on the wire", precision_choices, 0, 0},
        {"fp32-grad-wire", 0, FS_OPT_FLAG, &fp32_grad_wire, NULL, "under bf16, unit gradients fp32 on the wire (as train --fp32-grad-wire)", NULL, 0, 0},
        {"device", 'd', FS_OPT_STRING, &device, "NAME", "a published preset, or this machine measured", device_choices, 0, 0},
        {"device-mem", 0, FS_OPT_BYTES, &device_mem, "BYTES", "device memory (0: the preset's; this-machine: the RAM its ranks share)", NULL, 0, 0},
        {"recalibrate", 0, FS_OPT_FLAG, &recalibrate, NULL, "this-machine: measure again and rewrite the cache", NULL, 0, 0},
        {"json", 0, FS_OPT_FLAG, &json, NULL, "print one JSON object instead of the tables", NULL, 0, 0},
        {NULL, 0, 0, NULL, NULL, NULL, NULL, 0, 0},
    };
    int npos = 0;
    int rc = fs_args_parse("plan", &plan_help, opts, argc, argv, NULL, 0, &npos);
    if (rc < 0) return FS_EXIT_OK;
    if (rc != FS_EXIT_OK) return rc;
    int auto_ckpt = strcmp(ckpt, "auto") == 0;
    char *end = NULL;
    errno = 0; /* past LLONG_MAX strtoll gives LLONG_MAX, which later messages would echo */
    long long ckpt_n = auto_ckpt ? 0 : strtoll(ckpt, &end, 10);
    if (!auto_ckpt && (end == ckpt || *end || ckpt_n < 0 || errno == ERANGE))
        return fs_usage_error("plan", "--ckpt-layers: expected a number of blocks or 'auto', got '%s'", ckpt);
    const int auto_group = strcmp(shard_group_arg, "auto") == 0;
    errno = 0;
    long long shard_group = auto_group ? 0 : strtoll(shard_group_arg, &end, 10);
    if (!auto_group && (end == shard_group_arg || *end || shard_group < 0 || shard_group > (1 << 20) || errno == ERANGE))
        return fs_usage_error("plan", "--shard-group: expected a group size G (0 <= G <= 1048576) or 'auto', got '%s'",
                              shard_group_arg);

    fs_llama_config mc;
    const fs_hardware *hw = NULL;
    fs_train_config tc = fs_train_config_default();
    fs_status st = fs_llama_config_load(model, &mc);
    if (st == FS_OK && recalibrate && strcmp(device, "this-machine") != 0)
        return fs_usage_error("plan", "--recalibrate: only this-machine is measured ('%s' is a published preset)",
                              device);
    if (st == FS_OK)
        st = recalibrate ? fs_hardware_this_machine(FS_CALIBRATE_NOW, &hw) : fs_hardware_find(device, &hw);
    if (st == FS_OK) st = fs_strategy_parse(strategy, &tc.strategy);
    if (st == FS_OK) st = fs_precision_parse(precision, &tc.precision);
    if (st != FS_OK) return fs_cli_report("plan", st);
    if (seq > mc.max_position_embeddings)
        return fs_usage_error("plan", "--seq %" PRId64 " exceeds the model's max_position_embeddings (%" PRId64 ")",
                              seq, mc.max_position_embeddings);
    double capacity = device_mem > 0 ? (double)device_mem : hw->memory_bytes;
    /* this-machine's capacity is the host's RAM, which every rank on the host takes its total
     * from; a GPU's is the rank's own */
    const int sharing = fs_hardware_ranks_sharing_memory(hw, (int)world);
    tc.batch = batch;
    tc.seq = seq;
    tc.grad_accum = grad_accum;
    tc.ckpt_layers = ckpt_n;
    /* a published preset is a GPU: plan flatshard's GPU path (the ring even alone, fp32
     * gradients on the wire, since NCCL sums in the data type: docs/comm.md) */
    if (hw->origin == FS_HW_PUBLISHED) tc.device = FS_DEVICE_CUDA;
    tc.shard_group = (int)shard_group;
    tc.fp32_grad_wire = fp32_grad_wire;
    if (auto_group && (tc.strategy == FS_STRATEGY_DDP || tc.strategy == FS_STRATEGY_ZERO3_PARAM))
        return fs_usage_error("plan", "--shard-group auto: hybrid sharding is supported with yafsdp, zero1, zero2, not %s",
                              strategy);

    /* --shard-group auto: every G dividing W, each with its own checkpointing; the fastest
     * that fits (a tie goes to the larger G: less state held twice); if none fits, the one
     * needing the least memory */
    group_row *rows = NULL;
    int n_rows = 0, chosen = -1;
    if (auto_group) {
        rows = calloc((size_t)world, sizeof *rows); /* at most W divisors; W <= 2^20 */
        if (!rows) return fs_cli_report("plan", fs_errorf(FS_ERR_NOMEM, "--shard-group auto: %lld rows", (long long)world));
        for (int64_t g = 1; g <= world; g++) {
            if (world % g) continue;
            group_row *r = &rows[n_rows++];
            r->group = (int)g;
            fs_train_config t = tc;
            t.shard_group = (int)g;
            planned q;
            int64_t need;
            r->status = plan_fitting(&q, &mc, &t, (int)world, hw, auto_ckpt, capacity, sharing, &need);
            if (r->status != FS_OK) {
                snprintf(r->error, sizeof r->error, "%s", fs_error_message());
                continue;
            }
            r->ckpt_layers = t.ckpt_layers;
            r->total = q.total;
            r->fits = fits_memory(q.total, sharing, capacity);
            fs_estimate_step(&q.plan, hw, grad_accum, &r->est);
            free_plan(&q);
        }
        for (int i = 0; i < n_rows; i++)
            if (rows[i].status == FS_OK && rows[i].fits && (chosen < 0 || rows[i].est.step_s <= rows[chosen].est.step_s))
                chosen = i;
        for (int i = 0; i < n_rows && !(chosen >= 0 && rows[chosen].fits); i++)
            if (rows[i].status == FS_OK && (chosen < 0 || rows[i].total <= rows[chosen].total)) chosen = i;
        if (chosen < 0) { /* no G can be planned at all: the reason of G = W */
            fs_status st_w = rows[n_rows - 1].status;
            fs_errorf(st_w, "%s", rows[n_rows - 1].error);
            free(rows);
            return fs_cli_report("plan", st_w);
        }
        tc.shard_group = rows[chosen].group;
    }

    planned p;
    int64_t needed = -1;
    st = plan_fitting(&p, &mc, &tc, (int)world, hw, auto_ckpt, capacity, sharing, &needed);
    if (st != FS_OK) {
        free(rows);
        return fs_cli_report("plan", st);
    }
    fs_step_estimate est;
    fs_estimate_step(&p.plan, hw, grad_accum, &est);
    const int fits = fits_memory(p.total, sharing, capacity);
    static const char *const kinds[FS_EST_N_KINDS] = {"all_gather", "reduce_scatter", "all_reduce"};
    static const char *const origin_names[] = {
        [FS_HW_PUBLISHED] = "preset", [FS_HW_MEASURED] = "measured", [FS_HW_CACHED] = "cached"};

    if (json) {
        char model_json[4200];
        printf("{\"model\":%s,\"params\":%" PRId64 ",\"world\":%" PRId64 ",\"batch\":%" PRId64 ",\"seq\":%" PRId64
               ",\"grad_accum\":%" PRId64 ",\"ckpt_layers\":%" PRId64 ",\"strategy\":\"%s\",\"precision\":\"%s\","
               "\"shard_group\":%d,"
               "\"device\":\"%s\",\"device_figures\":\"%s\",\"device_bytes\":%.0f,\"ranks_sharing_memory\":%d,"
               "\"fits\":%s,\"bytes\":{",
               fs_cli_json_quote(model_json, sizeof model_json, model), p.layout.total_numel, world, batch, seq, grad_accum, tc.ckpt_layers, strategy, precision,
               p.plan.cfg.world,
               hw->name, origin_names[hw->origin], capacity, sharing, fits ? "true" : "false");
        for (int k = 0; k < FS_MEM_N_CATEGORIES; k++)
            printf("\"%s\":%" PRIu64 ",", fs_mem_category_name((fs_mem_category)k), p.bytes[k]);
        printf("\"nccl\":%" PRIu64 ",\"total\":%" PRIu64 "},\"comm\":{", p.nccl, p.total);
        for (int k = 0; k < FS_EST_N_KINDS; k++)
            printf("%s\"%s\":{\"count\":%" PRId64 ",\"bytes\":%.0f,\"wire_bytes\":%.0f}", k ? "," : "", kinds[k],
                   est.comm.count[k], est.comm.bytes[k], est.comm.wire[k]);
        printf("},\"estimate\":{\"compute_s\":%.17g,\"gemm_s\":%.17g,\"attention_s\":%.17g,\"memory_s\":%.17g,"
               "\"optimizer_s\":%.17g,\"comm_s\":%.17g,\"exposed_comm_s\":%.17g,\"step_s\":%.17g,"
               "\"tokens_per_s\":%.17g,\"mfu\":%.17g,\"busbw\":%.17g,\"flops\":%.17g,\"attention_flops\":%.17g,"
               "\"memory_bytes\":%.17g,\"optimizer_bytes\":%.17g,\"replica_busbw\":%.17g,\"cores_busy\":%d,"
               "\"contention\":%.17g}",
               est.compute_s, est.gemm_s, est.attention_s, est.memory_s, est.optimizer_s, est.comm_s,
               est.exposed_comm_s, est.step_s, est.tokens_per_s, est.mfu, est.busbw, est.flops, est.attention_flops,
               est.memory_bytes, est.optimizer_bytes, est.replica_busbw, est.cores_busy, est.contention);
        if (auto_group) {
            printf(",\"shard_group_auto\":{\"chosen\":%d,\"fits\":%s,\"candidates\":[", rows[chosen].group,
                   rows[chosen].fits ? "true" : "false");
            for (int i = 0; i < n_rows; i++) {
                const group_row *r = &rows[i];
                printf("%s{\"shard_group\":%d,", i ? "," : "", r->group);
                if (r->status != FS_OK) {
                    char error_json[2 * sizeof r->error + 16];
                    printf("\"error\":%s}", fs_cli_json_quote(error_json, sizeof error_json, r->error));
                    continue;
                }
                printf("\"ckpt_layers\":%" PRId64 ",\"total\":%" PRIu64 ",\"fits\":%s,\"step_s\":%.17g,"
                       "\"exposed_comm_s\":%.17g,\"comm_s\":%.17g,\"tokens_per_s\":%.17g,\"mfu\":%.17g}",
                       r->ckpt_layers, r->total, r->fits ? "true" : "false", r->est.step_s, r->est.exposed_comm_s,
                       r->est.comm_s, r->est.tokens_per_s, r->est.mfu);
            }
            printf("]}");
        }
        printf("}\n");
        free(rows);
        free_plan(&p);
        return FS_EXIT_OK;
    }
    if (auto_group) {
        printf("--shard-group auto: every G dividing the %" PRId64 " ranks, each with %s (docs/planner.md)\n", world,
               auto_ckpt ? "the fewest checkpointed blocks that fit" : "--ckpt-layers as given");
        if (sharing > 1)
            printf("  (memory GiB per rank; fits: %d ranks on a host share its %.1f GiB of RAM)\n", sharing,
                   capacity / 1073741824.0);
        printf("  %7s %7s %6s %11s %-12s %9s %10s %12s %6s\n", "G", "groups", "ckpt", "memory GiB", "fits",
               "step s", "exposed s", "tokens/s", "MFU");
        for (int i = 0; i < n_rows; i++) {
            const group_row *r = &rows[i];
            if (r->status != FS_OK) {
                printf("  %7d %7" PRId64 "   cannot be planned: %s\n", r->group, world / r->group, r->error);
                continue;
            }
            printf("  %7d %7" PRId64 " %6" PRId64 " %11.3f %-12s %9.4f %10.4f %12.0f %5.1f%%%s\n", r->group,
                   world / r->group, r->ckpt_layers, (double)r->total / 1073741824.0,
                   r->fits ? "fits" : "DOES NOT FIT", r->est.step_s, r->est.exposed_comm_s, r->est.tokens_per_s,
                   100.0 * r->est.mfu, i == chosen ? "  <-" : "");
        }
        if (rows[chosen].fits)
            printf("  fastest that fits: G = %d%s, %.4f s per step; its plan:\n", rows[chosen].group,
                   rows[chosen].group == world ? " (plain sharding, no replicas)" : "", rows[chosen].est.step_s);
        else
            printf("  no G fits the device; the plan of the one needing the least memory, G = %d:\n",
                   rows[chosen].group);
        free(rows);
        rows = NULL;
    }
    char desc[256];
    fs_cli_describe_model(&p.layout, desc, sizeof desc);
    printf("plan: %s %s\n", model, desc);
    printf("  %" PRId64 " rank%s, %s, %s, micro-batch %" PRId64 " x %" PRId64 " tokens, %" PRId64
           " micro-batch%s per step, %" PRId64 " checkpointed block%s\n",
           world, world == 1 ? "" : "s", strategy, precision, batch, seq, grad_accum, grad_accum == 1 ? "" : "es", tc.ckpt_layers,
           tc.ckpt_layers == 1 ? "" : "s");
    if (p.plan.cfg.replicas > 1)
        printf("  hybrid sharding: %d groups of %d rank%s: shard within, replicate across (the bytes "
               "below are a %d-way shard; the replicas' all-reduce at %.1f GB/s bus bandwidth)\n",
               p.plan.cfg.replicas, p.plan.cfg.world, p.plan.cfg.world == 1 ? "" : "s", p.plan.cfg.world,
               est.replica_busbw / 1e9);
    printf("  device %s: %s\n", hw->name, hw->description);
    printf("  device figures: %s\n", hw->origin_note);
    printf("memory per device, GiB (rank 0; activations at %.0f bytes per element on this device):\n",
           hw->activation_bytes);
    for (int k = 0; k < FS_MEM_N_CATEGORIES; k++)
        printf("  %-14s %10.3f\n", fs_mem_category_name((fs_mem_category)k), (double)p.bytes[k] / 1073741824.0);
    if (tc.device == FS_DEVICE_CUDA)
        printf("  %-14s %10.3f (NCCL's communicators beside the engine's allocator, an estimate: docs/planner.md)\n",
               "nccl", (double)p.nccl / 1073741824.0);
    if (sharing > 1) /* the RAM holds every rank of the host: say so, and the sum it must hold */
        printf("  %-14s %10.3f per rank x %d ranks on a host = %.3f of %.1f (the host's RAM, shared): %s\n", "total",
               (double)p.total / 1073741824.0, sharing, (double)p.total * sharing / 1073741824.0,
               capacity / 1073741824.0, fits ? "fits" : "DOES NOT FIT");
    else
        printf("  %-14s %10.3f of %.1f: %s\n", "total", (double)p.total / 1073741824.0, capacity / 1073741824.0,
               fits ? "fits" : "DOES NOT FIT");
    printf("  %-14s %10.3f (the staging of the save of --out, at the end, on top of the total)\n", "final save",
           (double)p.plan.save_bytes / 1073741824.0);
    if (auto_ckpt)
        printf("  --ckpt-layers auto: %s\n",
               needed >= 0 ? (needed == 0 ? "no checkpointing needed" : "the fewest checkpointed blocks that fit is above")
                           : "does not fit even with every block checkpointed");
    printf("communication per device per step:\n");
    printf("  %-15s %8s %14s %14s\n", "collective", "count", "buffer GiB", "sent GiB");
    for (int k = 0; k < FS_EST_N_KINDS; k++)
        if (est.comm.count[k])
            printf("  %-15s %8" PRId64 " %14.3f %14.3f\n", kinds[k], est.comm.count[k], est.comm.bytes[k] / 1073741824.0,
                   est.comm.wire[k] / 1073741824.0);
    if (hw->busy_cores > 1)
        printf("compute rates: %d rank%s computing at once on a host of %d cores; contention %.2f (0: one core's "
               "figures alone, 1: x%.3f, a block's time with all %d calibrated cores busy; docs/planner.md)\n",
               est.cores_busy, est.cores_busy == 1 ? "" : "s", hw->devices_per_node, est.contention,
               p.plan.cfg.precision == FS_PRECISION_BF16 ? hw->contention_bf16 : hw->contention_fp32, hw->busy_cores);
    printf("estimated step (docs/planner.md): compute %.3f s (GEMM %.3f, attention %.3f, memory-bound %.3f, "
           "optimizer %.3f), communication %.3f s at %.1f GB/s bus bandwidth of which %.3f s exposed -> %.3f s per "
           "step, %.0f tokens/s, MFU %.1f%%\n",
           est.compute_s, est.gemm_s, est.attention_s, est.memory_s, est.optimizer_s, est.comm_s, est.busbw / 1e9,
           est.exposed_comm_s, est.step_s, est.tokens_per_s, 100.0 * est.mfu);
    free_plan(&p);
    return FS_EXIT_OK;
}
