/* config.h - the flag table and the effective configuration of every process.
 *
 * One table (config.c) lists every flag: name, type, range, default, which
 * processes read it, help. Parsing, validation, --help, the launcher's
 * forwarding to its children and the effective-config dump in /health all
 * come from it, so a flag given to the launcher reaches every process that
 * reads it (vlmd_config_child_argv) and a process refuses a flag it does not
 * read instead of ignoring it. */
#ifndef VLMD_CONFIG_H
#define VLMD_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "role.h"
#include "status.h"

/* The effective configuration; strings are owned (vlmd_config_free). */
typedef struct vlmd_config {
    char *model;                    /* --model: model directory */
    char *host;                     /* --host: HTTP listen address */
    int64_t port;                   /* --port: HTTP port; 0 picks a free one */
    char *served_model_name;        /* --served-model-name: "" = model dir name */
    char *ui;                       /* --ui: on, off */
    char *task;                     /* --task: auto, generate, embed, rerank, generate+embed */
    char *runtime_dir;              /* --runtime-dir: ipc socket dir; "" = private temp dir */
    char *router_endpoint;          /* --router-endpoint: ipc:// or tcp://; "" = in runtime dir */
    char *log_level;                /* --log-level */
    char *device;                   /* --device: auto, cpu, cuda */
    int64_t heartbeat_ms;           /* --heartbeat-ms */
    int64_t heartbeat_timeout_ms;   /* --heartbeat-timeout-ms */
    int64_t busy_timeout_ms;        /* --busy-timeout-ms */
    int64_t restart_backoff_ms;     /* --restart-backoff-ms */
    int64_t restart_backoff_max_ms; /* --restart-backoff-max-ms */
    int64_t max_restarts_per_minute;/* --max-restarts-per-minute */
    int64_t start_timeout_s;        /* --start-timeout-s */
    int64_t shutdown_timeout_ms;    /* --shutdown-timeout-ms */
    int64_t max_total_token_num;    /* --max-total-token-num: KV cache tokens; 0 = automatic */
    int64_t batch_max_tokens;       /* --batch-max-tokens: tokens per engine step */
    int64_t max_num_seqs;           /* --max-num-seqs: requests decoding at once */
    int64_t max_model_len;          /* --max-model-len: prompt + output; 0 = the model's */
    char *embed_arena_path;         /* --embed-arena-path: shared file of image embeddings */
    int64_t embed_arena_mb;         /* --embed-arena-mb: its size */
    int64_t image_wait_ms;          /* --image-wait-ms: longest wait for arena room + encoding */
    int64_t visual_batch_size;      /* --visual-batch-size: images per vision forward */
    int64_t visual_nice;            /* --visual-nice: the visual worker's niceness */
    int64_t max_image_pixels;       /* --max-image-pixels: decoded width x height */
    int64_t vision_min_pixels;      /* --vision-min-pixels: resize floor; 0 = the model's */
    int64_t vision_max_pixels;      /* --vision-max-pixels: resize ceiling; 0 = the model's */
    int64_t max_images_per_request; /* --max-images-per-request */
    int64_t max_image_bytes;        /* --max-image-bytes: one encoded image */
    char *allowed_media_domains;    /* --allowed-media-domains: hosts images may be fetched from */
    int64_t media_fetch_timeout_ms; /* --media-fetch-timeout-ms */
    double mem_fraction;            /* --mem-fraction: share of the free device the KV may take */
    int64_t cpu_device_mb;          /* --cpu-device-mb: the CPU backend's simulated device; 0 = spare memory */
    int64_t threads;                /* --threads: the CPU backend's pool; 0 = the affinity's cores */
    int64_t max_queued_requests;    /* --max-queued-requests: waiting for KV room */
    double admission_output_fraction; /* --admission-output-fraction */
    char *admission_policy;         /* --admission-policy: fifo, fair */
    int64_t session_max_requests;   /* --session-max-requests: 0 = no limit */
    int64_t session_max_kv_tokens;  /* --session-max-kv-tokens: 0 = no limit */
    int64_t session_idle_s;         /* --session-idle-s */
    int64_t max_sessions;           /* --max-sessions */
    int64_t degrade_under_pressure; /* --degrade-under-pressure: KV-use percent; 0 = off */
    int64_t degrade_max_tokens;     /* --degrade-max-tokens */
    char *api_key_file;             /* --api-key-file: one key per line (and VLMD_API_KEY) */
    char *metrics_need_key;         /* --metrics-need-key: no | yes */
    char *cors_origins;             /* --cors-origins: "" off, "*" or a comma-separated list */
    int64_t max_body_bytes;         /* --max-body-bytes */
    int64_t max_header_bytes;       /* --max-header-bytes */
    int64_t max_messages;           /* --max-messages */
    int64_t max_prompt_bytes;       /* --max-prompt-bytes: text before tokenizing */
    int64_t max_output_tokens;      /* --max-output-tokens: 0 = the model's room */
    int64_t responses_store_entries;/* --responses-store-entries: 0 = none are stored */
    int64_t responses_store_mb;     /* --responses-store-mb */
    int64_t responses_store_ttl_s;  /* --responses-store-ttl-s */
    int64_t max_connections;        /* --max-connections */
    int64_t http2_reset_budget;     /* --http2-reset-budget: early cancels per connection */
    int64_t http2_address_reset_budget; /* --http2-address-reset-budget: early cancels per
                                         * client address, across its connections */
    int64_t request_timeout_s;      /* --request-timeout-s: queue wait + generation */
    int64_t keepalive_timeout_s;    /* --keepalive-timeout-s */
    int64_t send_timeout_s;         /* --send-timeout-s: a client that stops reading */
    int64_t drain_timeout_s;        /* --drain-timeout-s: SIGTERM lets requests finish */
    bool disable_prefix_cache;      /* --disable-prefix-cache */
    int64_t chunked_prefill_size;   /* --chunked-prefill-size: prompt tokens per request per step */
    bool enforce_eager;             /* --enforce-eager: no CUDA graphs for decode steps */
    bool check_invariants;          /* --check-invariants: the engine checks its books each step */
    char *kv_events_endpoint;       /* --kv-events-endpoint: ZMQ PUB of KV-cache events; "" = off */
    char *kv_events_topic;          /* --kv-events-topic: each batch's first frame */
    int64_t kv_events_block_size;   /* --kv-events-block-size: tokens per event block */
    char *kv_events_hash_seed;      /* --kv-events-hash-seed: the block hash chain's seed */
    char *cuda_attention;           /* --cuda-attention: fa2, mma, wmma */
    char *cuda_decode_linear;       /* --cuda-decode-linear: cublas, gemv */
    char *cuda_decode_attention;    /* --cuda-decode-attention: mma, cores */
    char *cuda_pdl;                 /* --cuda-pdl: off, on */
    char *fp8_activations;          /* --fp8-activations: off, on (W8A8 for FP8 weights) */
    char *kv_cache_dtype;           /* --kv-cache-dtype: auto, bf16, fp8 */
    char *kv_cache_scales;          /* --kv-cache-scales: "" (the checkpoint's, else measured)
                                     * or "K,V" for every layer */
    int64_t tensor_parallel_size;   /* --tensor-parallel-size: engine ranks of one model */
    int64_t rank;                   /* --rank: this engine's rank (the launcher gives each its own) */
    char *devices;                  /* --devices: GPU ordinals, one per rank; "" = rank r on GPU r */
    int64_t data_parallel_size;     /* --data-parallel-size: engines (groups of ranks) behind the router */
    int64_t data_parallel_rank;     /* --data-parallel-rank: this rank's engine (the launcher gives it) */
    char *route_large_requests;     /* --route-large-requests: TOKENS=ENGINE, "" = off */
} vlmd_config;

typedef enum vlmd_flag_type {
    VLMD_FLAG_STRING,
    VLMD_FLAG_INT,
    VLMD_FLAG_CHOICE,   /* a string limited to `choices` ("auto|cpu|cuda") */
    VLMD_FLAG_FLOAT,    /* a double in [fmin, fmax] */
    VLMD_FLAG_BOOL,     /* "--name" alone is true; "--name=true|false" */
} vlmd_flag_type;

typedef struct vlmd_flag {
    const char *name;           /* without the leading "--" */
    vlmd_flag_type type;
    size_t offset;              /* into vlmd_config */
    const char *default_value;  /* as text; parsed like a command-line value */
    long long min, max;         /* INT range, inclusive */
    const char *choices;        /* CHOICE: '|'-separated values */
    unsigned roles;             /* VLMD_ROLE_BIT()s of the processes that read it */
    const char *help;
    double fmin, fmax;          /* FLOAT range, inclusive */
} vlmd_flag;

/* The table, terminated by an entry with name == NULL. */
extern const vlmd_flag vlmd_flags[];

/* Fills cfg with every flag's default. */
void vlmd_config_init_defaults(vlmd_config *cfg);
void vlmd_config_free(vlmd_config *cfg);

/* Parses argv[first..argc) ("--name value" or "--name=value") into cfg, which holds defaults or earlier values.
 * Unknown flags, flags `role` does not read, bad values and stray arguments
 * are VLMD_ERR_USAGE / VLMD_ERR_INVALID_ARG with the flag and value named.
 * Sets *help when --help was given (parsing stops there). */
vlmd_status vlmd_config_parse(vlmd_config *cfg, vlmd_role role, int argc, char **argv, int first,
                              bool *help, vlmd_error *err);

/* Sets the flag `name` (without "--") from text as the parser would, for
 * any process: the tools that open a backend take --device and --cuda-*
 * this way. Unknown flags and bad values are errors naming them. */
vlmd_status vlmd_config_set(vlmd_config *cfg, const char *name, const char *value,
                            vlmd_error *err);

/* Checks what one flag cannot: required values and relations between flags. */
vlmd_status vlmd_config_validate(const vlmd_config *cfg, vlmd_role role, vlmd_error *err);

/* The name to serve: --served-model-name, or the last component of the model
 * directory (trailing slashes ignored). Writes into out. */
void vlmd_served_model_name(const char *flag_value, const char *model_dir, char *out, size_t outsz);
/* --devices read: how many GPU ordinals it lists (0 when empty), -1 when it is
 * not a comma-separated list of ordinals; *ordinal: rank's GPU (the rank-th
 * ordinal, or rank itself when the list is empty or shorter). */
int vlmd_config_devices(const vlmd_config *cfg, int64_t rank, int *ordinal);

/* Engines (groups of --tensor-parallel-size ranks) are numbered 0 to
 * --data-parallel-size - 1; an engine process's rank among all of them (its
 * registry rank, routing id "llm-R", supervisor child and --devices entry)
 * is engine * tensor_parallel_size + its rank in the engine. */
int64_t vlmd_config_process_rank(const vlmd_config *cfg);
/* --route-large-requests read: false when off; else the KV tokens (prompt +
 * max_tokens) from which a request goes to *engine. */
bool vlmd_config_large_route(const vlmd_config *cfg, uint64_t *tokens, uint32_t *engine);

/* Start-up helper for main(): defaults, parse, validate; prints --help and
 * exits 0, or prints the error and exits 2. */
void vlmd_config_parse_or_exit(vlmd_config *cfg, vlmd_role role, int argc, char **argv, int first);

/* Prints the flags `role` reads, with defaults and help. */
void vlmd_config_print_help(vlmd_role role, const char *usage, void *stream /* FILE* */);

/* Looks a flag up by name (without "--"); NULL when unknown. */
const vlmd_flag *vlmd_flag_find(const char *name);

/* Formats a flag's current value as text (what the parser would accept back). */
void vlmd_config_value_str(const vlmd_config *cfg, const vlmd_flag *flag, char *out, size_t outsz);

/* Builds "--name=value" arguments for every flag that process `child` reads,
 * with cfg's effective values. Returns a NULL-terminated heap array of heap
 * strings (vlmd_argv_free), or NULL on allocation failure. */
char **vlmd_config_child_argv(const vlmd_config *cfg, vlmd_role child, int *argc_out);
void vlmd_argv_free(char **argv);

/* Calls fn for every flag `role` reads, with its formatted value. */
typedef void (*vlmd_config_visit_fn)(const char *name, const char *value, void *ud);
void vlmd_config_foreach(const vlmd_config *cfg, vlmd_role role, vlmd_config_visit_fn fn, void *ud);

#endif
