/* config.c - the flag table and everything derived from it: parsing,
 * validation, help, forwarding to child processes, the effective-config dump.
 *
 * To add a flag: add a field to vlmd_config, a row here, and read the field.
 * The row's `roles` decides which processes accept it and receive it from the
 * launcher; the unit tests check every row's default and the forwarding. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "process.h"

#define R(role) VLMD_ROLE_BIT(VLMD_ROLE_##role)
#define OFF(field) offsetof(vlmd_config, field)

const vlmd_flag vlmd_flags[] = {
    {"model", VLMD_FLAG_STRING, OFF(model), "", 0, 0, NULL, VLMD_ROLES_ALL,
     "Model directory as downloaded from the Hugging Face Hub, no conversion (config.json, "
     "*.safetensors, tokenizer.json; preprocessor_config.json for images): Qwen2 and Qwen2.5 "
     "(Qwen2ForCausalLM), Qwen2-VL (Qwen2VLForConditionalGeneration), Qwen2.5-VL "
     "(Qwen2_5_VLForConditionalGeneration), Qwen3 (Qwen3ForCausalLM), Qwen3-MoE "
     "(Qwen3MoeForCausalLM), Qwen3-VL (Qwen3VLForConditionalGeneration), Qwen3-VL-MoE "
     "(Qwen3VLMoeForConditionalGeneration)"},
    {"host", VLMD_FLAG_STRING, OFF(host), "127.0.0.1", 0, 0, NULL, R(LAUNCHER) | R(FRONTEND),
     "Address the HTTP server listens on; loopback by default, 0.0.0.0 or :: for every interface"},
    {"port", VLMD_FLAG_INT, OFF(port), "8000", 0, 65535, NULL, R(LAUNCHER) | R(FRONTEND),
     "HTTP port; 0 picks a free port (the launcher prints the one chosen)"},
    {"served-model-name", VLMD_FLAG_STRING, OFF(served_model_name), "", 0, 0, NULL,
     R(LAUNCHER) | R(FRONTEND) | R(LLM),
     "Model name in the API (and in the KV-event block hashes); empty means the model "
     "directory's name"},
    {"ui", VLMD_FLAG_CHOICE, OFF(ui), "on", 0, 0, "on|off", R(LAUNCHER) | R(FRONTEND),
     "the console at /: a chat page and a live picture of the memory (docs/API.md, The "
     "console); off: / is a 404"},
    {"task", VLMD_FLAG_CHOICE, OFF(task), "auto", 0, 0,
     "auto|generate|embed|rerank|generate+embed", R(LAUNCHER) | R(FRONTEND),
     "what the model serves: generate (chat and completions), embed (/v1/embeddings: "
     "last-token pooling, L2-normalised), rerank (/v1/rerank and /v1/score: Qwen3-Reranker's "
     "yes/no prompt) or generate+embed (both from one engine, as llama.cpp's --embeddings); "
     "auto: embed for a sentence-transformers checkpoint (modules.json with last-token "
     "pooling), rerank for a model whose README names a reranker, else generate"},
    {"runtime-dir", VLMD_FLAG_STRING, OFF(runtime_dir), "", 0, 0, NULL, R(LAUNCHER),
     "Directory for this instance's ipc sockets and embedding arena; empty means a private new "
     "directory under the first of $XDG_RUNTIME_DIR, /dev/shm and /tmp with room for the arena, "
     "removed at exit"},
    {"router-endpoint", VLMD_FLAG_STRING, OFF(router_endpoint), "", 0, 0, NULL, VLMD_ROLES_ALL,
     "ZeroMQ endpoint of the router (ipc://PATH or tcp://HOST:PORT); empty means "
     "ipc://RUNTIME_DIR/router.sock (launcher only; workers need it set)"},
    {"log-level", VLMD_FLAG_CHOICE, OFF(log_level), "info", 0, 0, "debug|info|warn|error",
     VLMD_ROLES_ALL, "Least severe log level written to stderr"},
    {"device", VLMD_FLAG_CHOICE, OFF(device), "auto", 0, 0, "auto|cpu|cuda",
     R(LAUNCHER) | R(VISUAL) | R(LLM),
     "Compute backend of the workers; auto takes CUDA when built with it, a GPU is present and "
     "the backend can run the worker's model, else the CPU"},
    {"heartbeat-ms", VLMD_FLAG_INT, OFF(heartbeat_ms), "500", 10, 60000, NULL, VLMD_ROLES_ALL,
     "Interval between heartbeats from every process to the router"},
    {"heartbeat-timeout-ms", VLMD_FLAG_INT, OFF(heartbeat_timeout_ms), "3000", 30, 600000, NULL,
     R(LAUNCHER) | R(ROUTER) | R(FRONTEND),
     "A process silent this long is reported down (at least 3 heartbeat intervals)"},
    {"busy-timeout-ms", VLMD_FLAG_INT, OFF(busy_timeout_ms), "60000", 30, 3600000, NULL,
     R(LAUNCHER),
     "A process silent past --heartbeat-timeout-ms whose loop thread is still computing is "
     "busy, not hung: it has this much longer before it is killed (one that computes nothing "
     "is killed at once)"},
    {"restart-backoff-ms", VLMD_FLAG_INT, OFF(restart_backoff_ms), "200", 10, 600000, NULL,
     R(LAUNCHER), "First delay before restarting a worker that exited; doubles per restart"},
    {"restart-backoff-max-ms", VLMD_FLAG_INT, OFF(restart_backoff_max_ms), "10000", 10, 3600000,
     NULL, R(LAUNCHER), "Longest delay between restarts of one worker"},
    {"max-restarts-per-minute", VLMD_FLAG_INT, OFF(max_restarts_per_minute), "10", 0, 1000, NULL,
     R(LAUNCHER),
     "Restarts of one process within a minute past which each further restart waits "
     "--restart-backoff-max-ms; the server keeps running (only a process that exits three "
     "times in a row before becoming ready stops it)"},
    {"start-timeout-s", VLMD_FLAG_INT, OFF(start_timeout_s), "900", 1, 86400, NULL, R(LAUNCHER),
     "Time every process has to report ready at start-up before the server gives up"},
    {"shutdown-timeout-ms", VLMD_FLAG_INT, OFF(shutdown_timeout_ms), "10000", 0, 600000, NULL,
     R(LAUNCHER), "After SIGTERM, time the processes have to exit before SIGKILL"},
    {"max-total-token-num", VLMD_FLAG_INT, OFF(max_total_token_num), "0", 0, 1LL << 30, NULL,
     R(LAUNCHER) | R(LLM),
     "Tokens the KV cache holds; 0 lets the auto-profile size it from the device's memory "
     "(N skips the search: one validation at N)"},
    {"batch-max-tokens", VLMD_FLAG_INT, OFF(batch_max_tokens), "4096", 1, 1 << 20, NULL,
     R(LAUNCHER) | R(LLM), "Most tokens one engine step processes (prompts and decodes together)"},
    {"max-num-seqs", VLMD_FLAG_INT, OFF(max_num_seqs), "64", 1, 4096, NULL, R(LAUNCHER) | R(LLM),
     "Most requests decoding at once"},
    {"max-model-len", VLMD_FLAG_INT, OFF(max_model_len), "0", 0, 1 << 24, NULL,
     R(LAUNCHER) | R(LLM) | R(FRONTEND),
     "Longest prompt + output of one request; 0 means the model's max_position_embeddings, "
     "lowered at start-up to what the device fits (/health says why); a given length that "
     "cannot fit stops the engine at once"},
    {"embed-arena-path", VLMD_FLAG_STRING, OFF(embed_arena_path), "", 0, 0, NULL,
     R(LAUNCHER) | R(ROUTER) | R(VISUAL) | R(LLM),
     "Shared-memory file that carries image embeddings from the visual worker to the engine; "
     "empty means RUNTIME_DIR/embeddings.arena (launcher only; the others need it set)"},
    {"embed-arena-mb", VLMD_FLAG_INT, OFF(embed_arena_mb), "256", 1, 1 << 20, NULL,
     R(LAUNCHER) | R(ROUTER),
     "Size of the embedding arena, host shared memory reserved whole at start-up (no room for "
     "it: vlmd refuses to start); encoded images stay cached in it until room is needed"},
    {"image-wait-ms", VLMD_FLAG_INT, OFF(image_wait_ms), "30000", 10, 3600000, NULL,
     R(LAUNCHER) | R(ROUTER) | R(VISUAL),
     "Longest a request may wait for room in the embedding arena and for its images to be "
     "encoded before it fails with 503 (the visual worker drops, unencoded, a job that waited "
     "this long in its queue)"},
    {"visual-batch-size", VLMD_FLAG_INT, OFF(visual_batch_size), "2", 1, 256, NULL,
     R(LAUNCHER) | R(VISUAL),
     "Images the vision tower encodes at once; the visual worker reserves memory for this many "
     "images of the largest size at start-up"},
    {"visual-nice", VLMD_FLAG_INT, OFF(visual_nice), "10", 0, 19, NULL, R(LAUNCHER) | R(VISUAL),
     "Scheduling niceness of the visual worker's decoding and encoding threads: above 0 they "
     "yield the CPU to the engine's steps, so costly images slow text less (0: an equal "
     "share)"},
    {"max-image-pixels", VLMD_FLAG_INT, OFF(max_image_pixels), "33554432", 1, 1LL << 32, NULL,
     R(LAUNCHER) | R(FRONTEND) | R(VISUAL),
     "Largest decoded image (width x height, read from its header before decoding); larger "
     "images get a 400"},
    {"vision-min-pixels", VLMD_FLAG_INT, OFF(vision_min_pixels), "0", 0, 1LL << 32, NULL,
     R(LAUNCHER) | R(FRONTEND) | R(VISUAL),
     "Smallest resized image the vision tower sees; 0 means preprocessor_config.json's"},
    {"vision-max-pixels", VLMD_FLAG_INT, OFF(vision_max_pixels), "0", 0, 1LL << 32, NULL,
     R(LAUNCHER) | R(FRONTEND) | R(VISUAL),
     "Largest resized image the vision tower sees (it bounds an image's tokens); 0 means "
     "preprocessor_config.json's"},
    {"max-images-per-request", VLMD_FLAG_INT, OFF(max_images_per_request), "8", 1, 64, NULL,
     R(LAUNCHER) | R(FRONTEND), "Most images one request may carry"},
    {"max-image-bytes", VLMD_FLAG_INT, OFF(max_image_bytes), "16777216", 1, 1 << 26, NULL,
     R(LAUNCHER) | R(FRONTEND), "Largest encoded image (after base64 decoding, or fetched)"},
    {"allowed-media-domains", VLMD_FLAG_STRING, OFF(allowed_media_domains), "", 0, 0, NULL,
     R(LAUNCHER) | R(FRONTEND),
     "Comma-separated hosts that http(s) image URLs may name; empty allows none (only data: "
     "URIs), so the server fetches nothing a client chooses"},
    {"media-fetch-timeout-ms", VLMD_FLAG_INT, OFF(media_fetch_timeout_ms), "10000", 100, 600000,
     NULL, R(LAUNCHER) | R(FRONTEND), "Longest time to fetch one image URL"},
    {"mem-fraction", VLMD_FLAG_FLOAT, OFF(mem_fraction), "0.95", 0, 0, NULL,
     R(LAUNCHER) | R(LLM),
     "Share of the device memory left after weights, activations, the visual worker and the "
     "256 MiB canary that the KV cache takes (the auto-profile's target)", 0.05, 1.0},
    {"cpu-device-mb", VLMD_FLAG_INT, OFF(cpu_device_mb), "0", 0, 1 << 24, NULL,
     R(LAUNCHER) | R(VISUAL) | R(LLM),
     "The CPU backend works as a device of this size (host memory, taken as used): the "
     "auto-profile sizes the KV cache within it. 0: what the machine can spare at start-up, "
     "the available memory (within a cgroup's limit) less a tenth of it, at least 1 GiB "
     "(the launcher measures it once for every process)"},
    {"threads", VLMD_FLAG_INT, OFF(threads), "0", 0, 4096, NULL, R(LAUNCHER) | R(VISUAL) | R(LLM),
     "Threads the CPU backend's ops run on, per worker; 0 means the cores the process may use "
     "(its CPU affinity)"},
    {"max-queued-requests", VLMD_FLAG_INT, OFF(max_queued_requests), "1024", 1, 1 << 20, NULL,
     R(LAUNCHER) | R(ROUTER),
     "Requests that may wait for room in the KV cache; more get 503 with Retry-After"},
    {"admission-output-fraction", VLMD_FLAG_FLOAT, OFF(admission_output_fraction), "1", 0, 0,
     NULL, R(LAUNCHER) | R(ROUTER),
     "Share of each request's max_tokens the admission estimate counts: 1 admits only what "
     "can finish without preemption; less admits more and lets preemption handle the rest",
     0.0, 1.0},
    {"admission-policy", VLMD_FLAG_CHOICE, OFF(admission_policy), "fair", 0, 0, "fair|fifo",
     R(LAUNCHER) | R(ROUTER),
     "Order in which waiting requests get KV room: fair, in arrival order, but a request that "
     "fits may pass one that does not (at most 64 times), and X-Session-IDs take turns "
     "(requests without one are one session); fifo, first come first served (one that does "
     "not fit holds back the rest)"},
    {"session-max-requests", VLMD_FLAG_INT, OFF(session_max_requests), "0", 0, 1 << 20, NULL,
     R(LAUNCHER) | R(ROUTER),
     "Requests one X-Session-ID may have in flight; more get 429 (0: no limit)"},
    {"session-max-kv-tokens", VLMD_FLAG_INT, OFF(session_max_kv_tokens), "0", 0, 1LL << 40, NULL,
     R(LAUNCHER) | R(ROUTER),
     "KV tokens (prompt + max_tokens of each request) one X-Session-ID may hold; more get 429 "
     "(0: no limit)"},
    {"session-idle-s", VLMD_FLAG_INT, OFF(session_idle_s), "600", 1, 1 << 24, NULL,
     R(LAUNCHER) | R(ROUTER), "A session with nothing in flight is forgotten after this long"},
    {"max-sessions", VLMD_FLAG_INT, OFF(max_sessions), "10000", 1, 1 << 24, NULL,
     R(LAUNCHER) | R(ROUTER),
     "Sessions tracked at once; the least recently used idle one makes room for a new one"},
    {"degrade-under-pressure", VLMD_FLAG_INT, OFF(degrade_under_pressure), "0", 0, 100, NULL,
     R(LAUNCHER) | R(ROUTER),
     "KV use (percent of the cache) above which new requests' max_tokens are capped at "
     "--degrade-max-tokens, said in an x-vlmd-max-tokens-capped header (0: off; sampling is "
     "never changed)"},
    {"degrade-max-tokens", VLMD_FLAG_INT, OFF(degrade_max_tokens), "512", 1, 1 << 24, NULL,
     R(LAUNCHER) | R(ROUTER), "The max_tokens cap of --degrade-under-pressure"},
    {"api-key-file", VLMD_FLAG_STRING, OFF(api_key_file), "", 0, 0, NULL,
     R(LAUNCHER) | R(FRONTEND),
     "File of API keys, one per line: requests need \"Authorization: Bearer KEY\" (401 "
     "otherwise). The VLMD_API_KEY environment variable adds one more. There is no --api-key: "
     "a key on the command line can be read by every local user in the process list"},
    {"metrics-need-key", VLMD_FLAG_CHOICE, OFF(metrics_need_key), "no", 0, 0, "no|yes",
     R(LAUNCHER) | R(FRONTEND),
     "Whether /metrics and /memory_stats need an API key too (/health never does)"},
    {"cors-origins", VLMD_FLAG_STRING, OFF(cors_origins), "", 0, 0, NULL,
     R(LAUNCHER) | R(FRONTEND),
     "Origins a browser may call the API from: comma-separated, or * for any; empty: no CORS"},
    {"max-body-bytes", VLMD_FLAG_INT, OFF(max_body_bytes), "8388608", 1024, 1LL << 30, NULL,
     R(LAUNCHER) | R(FRONTEND),
     "Largest request body (413 beyond; past twice this it is refused before it is read, "
     "and up to 8 times this is read and dropped so the client sees the 413)"},
    {"max-header-bytes", VLMD_FLAG_INT, OFF(max_header_bytes), "16384", 1024, 400000, NULL,
     R(LAUNCHER) | R(FRONTEND), "Largest request header section (431 beyond)"},
    {"max-messages", VLMD_FLAG_INT, OFF(max_messages), "1024", 1, 1 << 20, NULL,
     R(LAUNCHER) | R(FRONTEND), "Most messages in one chat request (400 beyond)"},
    {"max-prompt-bytes", VLMD_FLAG_INT, OFF(max_prompt_bytes), "4194304", 1, 1LL << 30, NULL,
     R(LAUNCHER) | R(FRONTEND),
     "Most bytes of text (messages or prompt) one request may carry, checked before "
     "tokenizing (400 beyond)"},
    {"max-output-tokens", VLMD_FLAG_INT, OFF(max_output_tokens), "0", 0, 1 << 24, NULL,
     R(LAUNCHER) | R(FRONTEND),
     "Most tokens one request may ask to generate (400 beyond); 0: up to the model's room"},
    {"responses-store-entries", VLMD_FLAG_INT, OFF(responses_store_entries), "1024", 0, 100000,
     NULL, R(LAUNCHER) | R(FRONTEND),
     "Most responses of the Responses API kept in the frontend's memory for GET "
     "/v1/responses/{id} and previous_response_id (the oldest go first); 0: none are kept"},
    {"responses-store-mb", VLMD_FLAG_INT, OFF(responses_store_mb), "256", 1, 1 << 20, NULL,
     R(LAUNCHER) | R(FRONTEND),
     "Most MiB the kept responses may take, their conversations (input items, images "
     "included) counted whole in each"},
    {"responses-store-ttl-s", VLMD_FLAG_INT, OFF(responses_store_ttl_s), "3600", 1, 7 * 86400,
     NULL, R(LAUNCHER) | R(FRONTEND), "How long a kept response stays after it was answered"},
    {"max-connections", VLMD_FLAG_INT, OFF(max_connections), "1024", 1, 1 << 20, NULL,
     R(LAUNCHER) | R(FRONTEND), "Open client connections; more are closed as they arrive"},
    {"http2-reset-budget", VLMD_FLAG_INT, OFF(http2_reset_budget), "100", 0, 1 << 20, NULL,
     R(LAUNCHER) | R(FRONTEND),
     "Requests one HTTP/2 connection may cancel before their answer begins (each answered "
     "one earns one back, up to this many); one more and the connection gets GOAWAY and is "
     "closed (rapid reset)"},
    {"http2-address-reset-budget", VLMD_FLAG_INT, OFF(http2_address_reset_budget), "1000", 0,
     1 << 20, NULL, R(LAUNCHER) | R(FRONTEND),
     "Requests the HTTP/2 connections of one client address (an IPv4 address, an IPv6 /64) "
     "may cancel before their answer begins, together and across reconnects; it refills over "
     "a minute and each answered one earns one back. Past it, that address's HTTP/2 "
     "connections get GOAWAY and are closed until it refills (0: no such budget)"},
    {"request-timeout-s", VLMD_FLAG_INT, OFF(request_timeout_s), "600", 1, 86400, NULL,
     R(LAUNCHER) | R(FRONTEND),
     "Longest a request may take, queueing and generation together; then it ends with 504 "
     "(or an error event when streaming) and is cancelled"},
    {"keepalive-timeout-s", VLMD_FLAG_INT, OFF(keepalive_timeout_s), "10", 1, 3600, NULL,
     R(LAUNCHER) | R(FRONTEND),
     "Time a client has to send a whole request (headers and body), and the longest an idle "
     "connection stays open"},
    {"send-timeout-s", VLMD_FLAG_INT, OFF(send_timeout_s), "30", 1, 3600, NULL,
     R(LAUNCHER) | R(FRONTEND),
     "A client that does not read its answer for this long is cut off and its request "
     "cancelled"},
    {"drain-timeout-s", VLMD_FLAG_INT, OFF(drain_timeout_s), "30", 0, 3600, NULL,
     R(LAUNCHER) | R(FRONTEND),
     "On SIGTERM, time running requests have to finish (no new ones are accepted) before the "
     "server stops"},
    {"disable-prefix-cache", VLMD_FLAG_BOOL, OFF(disable_prefix_cache), "false", 0, 0, NULL,
     R(LAUNCHER) | R(LLM),
     "Compute every prompt in full instead of reusing the KV of prefixes computed before"},
    {"chunked-prefill-size", VLMD_FLAG_INT, OFF(chunked_prefill_size), "4096", 1, 1 << 24, NULL,
     R(LAUNCHER) | R(LLM),
     "Most prompt tokens of one request per engine step: a longer prompt is prefilled over "
     "several steps, between the decode steps of the others (the step's budget is "
     "--batch-max-tokens)"},
    {"enforce-eager", VLMD_FLAG_BOOL, OFF(enforce_eager), "false", 0, 0, NULL,
     R(LAUNCHER) | R(LLM),
     "Launch every kernel of a decode step one by one instead of replaying the CUDA graphs "
     "captured at start-up (slower; for debugging). /health shows the effective setting"},
    {"check-invariants", VLMD_FLAG_BOOL, OFF(check_invariants), "false", 0, 0, NULL,
     R(LAUNCHER) | R(LLM),
     "Check the engine's invariant (its requests' states and KV books, every KV slot held "
     "once) after every step, in any build (a cost of the order of the KV slots a step). On "
     "a failure the engine logs what disagreed, ends every request with an error (500), "
     "empties the KV cache and goes on serving; without it only debug builds check, and "
     "stop the process"},
    {"kv-events-endpoint", VLMD_FLAG_STRING, OFF(kv_events_endpoint), "", 0, 0, NULL,
     R(LAUNCHER) | R(LLM),
     "ZeroMQ endpoint where the engine publishes its prefix cache's changes as vLLM's "
     "KV-cache events (BlockStored, BlockRemoved, AllBlocksCleared; for prefix-aware "
     "gateways): tcp://*:PORT or ipc://PATH binds, tcp://HOST:PORT connects; empty: off"},
    {"kv-events-topic", VLMD_FLAG_STRING, OFF(kv_events_topic), "", 0, 0, NULL,
     R(LAUNCHER) | R(LLM),
     "Topic (first frame) of every KV-event batch; llm-d reads kv@POD_ADDRESS@MODEL"},
    {"kv-events-block-size", VLMD_FLAG_INT, OFF(kv_events_block_size), "16", 1, 4096, NULL,
     R(LAUNCHER) | R(LLM),
     "Tokens per block of the KV events (cached prefixes are cut into blocks of this many "
     "tokens), also the block_size of vllm:cache_config_info"},
    {"kv-events-hash-seed", VLMD_FLAG_STRING, OFF(kv_events_hash_seed), "", 0, 0, NULL,
     R(LAUNCHER) | R(LLM),
     "Seed of the KV-event block hashes (llm-d's hashSeed; vLLM's PYTHONHASHSEED)"},
    {"tensor-parallel-size", VLMD_FLAG_INT, OFF(tensor_parallel_size), "1", 1, 16, NULL,
     R(LAUNCHER) | R(ROUTER) | R(LLM),
     "Engine processes (ranks) one model is split across (tensor parallelism): attention "
     "heads, the MLP and the vocabulary divided among them, each rank holding its share of "
     "the weights and the KV cache; the ranks are restarted together. The CPU backend runs "
     "them as processes of this host; the model's attention heads, MLP width and experts must "
     "divide by it"},
    {"devices", VLMD_FLAG_STRING, OFF(devices), "", 0, 0, NULL,
     R(LAUNCHER) | R(ROUTER) | R(VISUAL) | R(LLM),
     "GPUs of the engines' processes, comma-separated CUDA ordinals, one per process in the "
     "order engine 0's ranks, engine 1's... (the first also the visual worker's); empty: "
     "process p on GPU p. The CPU backend ignores it"},
    {"rank", VLMD_FLAG_INT, OFF(rank), "0", 0, 15, NULL, R(LAUNCHER) | R(LLM),
     "This process's rank in its engine (among --tensor-parallel-size): rank 0 schedules and "
     "talks to the router, the others follow its steps. Set per process by vlmd serve (which "
     "takes only 0) or, without it, by `vlmd args llm ... --rank R` in the deploy files"},
    {"data-parallel-size", VLMD_FLAG_INT, OFF(data_parallel_size), "1", 1, 16, NULL,
     R(LAUNCHER) | R(ROUTER) | R(LLM),
     "Engines behind the router, each a whole copy of the model (of --tensor-parallel-size "
     "ranks) with its own KV cache: a request goes to the engine holding its longest cached "
     "prefix among those with room, else to the least loaded. Engines may run on other hosts "
     "(vlmd llm --data-parallel-rank G --router-endpoint tcp://...)"},
    {"data-parallel-rank", VLMD_FLAG_INT, OFF(data_parallel_rank), "0", 0, 15, NULL,
     R(LAUNCHER) | R(LLM),
     "This process's engine among --data-parallel-size. Set per process by vlmd serve (which "
     "takes only 0) or by `vlmd args llm ... --data-parallel-rank G` in the deploy files"},
    {"route-large-requests", VLMD_FLAG_STRING, OFF(route_large_requests), "", 0, 0, NULL,
     R(LAUNCHER) | R(ROUTER),
     "TOKENS=ENGINE: requests whose KV need (prompt + max_tokens) reaches TOKENS go to engine "
     "ENGINE (a larger one), and the others stay off it unless it is idle; empty: off"},
    /* the CUDA backend's ways kept until a GPU run has compared them (the CPU ignores them) */
    {"cuda-attention", VLMD_FLAG_CHOICE, OFF(cuda_attention), "fa2", 0, 0, "fa2|mma|wmma",
     R(LAUNCHER) | R(VISUAL) | R(LLM),
     "CUDA attention kernels: fa2 (prefill in FlashAttention-2's 128-row tiles, 32 rows a warp "
     "on mma.sync; head dims that are multiples of 8 up to 128), mma (the first "
     "register-resident kernels: 64-row tiles, 16 rows a warp) or wmma (S, P and O through "
     "shared memory; 7x slower; multiples of 16). Decode steps: --cuda-decode-attention"},
    {"cuda-decode-attention", VLMD_FLAG_CHOICE, OFF(cuda_decode_attention), "mma", 0, 0,
     "mma|cores", R(LAUNCHER) | R(LLM),
     "CUDA attention of decode steps over a bf16 cache: mma (the prefill's tiles on mma.sync, "
     "one warp a KV head's group: a sequence's tokens are the same computed in a decode step "
     "or again after a preemption) or cores (the split-KV decode kernel on CUDA cores that an "
     "FP8 cache always takes: splits by each sequence's length, a KV head's group sharing every "
     "load; recomputed tokens may differ from decoded ones at a near tie)"},
    {"cuda-decode-linear", VLMD_FLAG_CHOICE, OFF(cuda_decode_linear), "cublas", 0, 0,
     "cublas|gemv", R(LAUNCHER) | R(VISUAL) | R(LLM),
     "CUDA linears of 1 or 2 rows (decode steps): cuBLAS, or vlmd's GEMV kernel (faster there "
     "on an H200, but a batch then decodes differently from its sequences alone)"},
    {"fp8-activations", VLMD_FLAG_CHOICE, OFF(fp8_activations), "off", 0, 0, "off|on",
     R(LAUNCHER) | R(LLM),
     "an FP8 checkpoint's linears W8A8: their inputs quantized to e4m3 per token and block of "
     "128 columns, as the published FP8 models were calibrated for (vLLM's way); off: weights "
     "only (W8A16), the closer to the 16-bit model"},
    {"kv-cache-dtype", VLMD_FLAG_CHOICE, OFF(kv_cache_dtype), "auto", 0, 0, "auto|bf16|fp8",
     R(LAUNCHER) | R(LLM),
     "the KV cache's type: fp8 (e4m3, half the bytes a token: about twice the tokens) with "
     "per-layer K and V scales from the checkpoint, else measured at start-up on text vlmd "
     "ships; bf16: the 16-bit cache (fp32 for an F32 checkpoint on the CPU); auto: fp8 where "
     "the checkpoint's kv_cache_scheme says so, else bf16"},
    {"kv-cache-scales", VLMD_FLAG_STRING, OFF(kv_cache_scales), "", 0, 0, NULL,
     R(LAUNCHER) | R(LLM),
     "an FP8 KV cache's scales as K,V (two positive numbers) for every layer, over the "
     "checkpoint's and instead of measuring them; empty: the checkpoint's, else measured"},
    {"cuda-pdl", VLMD_FLAG_CHOICE, OFF(cuda_pdl), "off", 0, 0, "off|on",
     R(LAUNCHER) | R(VISUAL) | R(LLM),
     "CUDA kernel launches allow programmatic dependent launch (Hopper): a kernel's launch "
     "overlaps the end of the one before it"},
    {NULL, 0, 0, NULL, 0, 0, NULL, 0, NULL, 0, 0},
};

#undef R
#undef OFF

const vlmd_flag *vlmd_flag_find(const char *name)
{
    for (const vlmd_flag *f = vlmd_flags; f->name; f++)
        if (strcmp(f->name, name) == 0)
            return f;
    return NULL;
}

static char **field_str(vlmd_config *cfg, const vlmd_flag *f)
{
    return (char **)((char *)cfg + f->offset);
}

static int64_t *field_int(vlmd_config *cfg, const vlmd_flag *f)
{
    return (int64_t *)((char *)cfg + f->offset);
}

static double *field_double(vlmd_config *cfg, const vlmd_flag *f)
{
    return (double *)((char *)cfg + f->offset);
}

static bool *field_bool(vlmd_config *cfg, const vlmd_flag *f)
{
    return (bool *)((char *)cfg + f->offset);
}

static bool choice_allowed(const char *choices, const char *v)
{
    size_t n = strlen(v);
    for (const char *p = choices; p && *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, v, n) == 0)
            return true;
        p = bar ? bar + 1 : NULL;
    }
    return false;
}

/* Sets one flag from text; cfg is unchanged on failure. */
static vlmd_status flag_set(vlmd_config *cfg, const vlmd_flag *f, const char *v, vlmd_error *err)
{
    switch (f->type) {
    case VLMD_FLAG_CHOICE:
        if (!choice_allowed(f->choices, v))
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "--%s: '%s' is not one of %s", f->name,
                               v, f->choices);
        /* fall through */
    case VLMD_FLAG_STRING: {
        char *copy = strdup(v);
        if (!copy)
            return vlmd_errorf(err, VLMD_ERR_NOMEM, "--%s: out of memory", f->name);
        free(*field_str(cfg, f));
        *field_str(cfg, f) = copy;
        return VLMD_OK;
    }
    case VLMD_FLAG_INT: {
        long long x;
        if (vlmd_parse_i64(v, f->min, f->max, &x) != VLMD_OK)
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG,
                               "--%s: '%s' is not an integer in [%lld, %lld]", f->name, v, f->min,
                               f->max);
        *field_int(cfg, f) = x;
        return VLMD_OK;
    }
    case VLMD_FLAG_BOOL:
        if (strcmp(v, "true") != 0 && strcmp(v, "false") != 0)
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "--%s: '%s' is not true or false",
                               f->name, v);
        *field_bool(cfg, f) = strcmp(v, "true") == 0;
        return VLMD_OK;
    case VLMD_FLAG_FLOAT: {
        double x;
        if (vlmd_parse_double(v, f->fmin, f->fmax, &x) != VLMD_OK)
            return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "--%s: '%s' is not a number in [%g, %g]",
                               f->name, v, f->fmin, f->fmax);
        *field_double(cfg, f) = x;
        return VLMD_OK;
    }
    }
    return vlmd_errorf(err, VLMD_ERR_INTERNAL, "--%s: unknown flag type", f->name);
}

void vlmd_config_init_defaults(vlmd_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    for (const vlmd_flag *f = vlmd_flags; f->name; f++) {
        vlmd_error err;
        if (flag_set(cfg, f, f->default_value, &err) != VLMD_OK) {
            fprintf(stderr, "vlmd: broken default in the flag table: %s\n", err.msg);
            abort();
        }
    }
}

void vlmd_config_free(vlmd_config *cfg)
{
    if (!cfg)
        return;
    for (const vlmd_flag *f = vlmd_flags; f->name; f++) {
        if (f->type == VLMD_FLAG_STRING || f->type == VLMD_FLAG_CHOICE) {
            free(*field_str(cfg, f));
            *field_str(cfg, f) = NULL;
        }
    }
}

vlmd_status vlmd_config_set(vlmd_config *cfg, const char *name, const char *value,
                            vlmd_error *err)
{
    const vlmd_flag *f = vlmd_flag_find(name);
    if (!f)
        return vlmd_errorf(err, VLMD_ERR_USAGE, "unknown flag '--%s'", name);
    return flag_set(cfg, f, value, err);
}

vlmd_status vlmd_config_parse(vlmd_config *cfg, vlmd_role role, int argc, char **argv, int first,
                              bool *help, vlmd_error *err)
{
    if (help)
        *help = false;
    for (int i = first; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            if (help)
                *help = true;
            return VLMD_OK;
        }
        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0')
            return vlmd_errorf(err, VLMD_ERR_USAGE, "unexpected argument '%s' (flags start with --)",
                               arg);
        char name[64];
        const char *eq = strchr(arg + 2, '=');
        size_t nlen = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
        if (nlen >= sizeof name)
            return vlmd_errorf(err, VLMD_ERR_USAGE, "unknown flag '%.80s'", arg);
        memcpy(name, arg + 2, nlen);
        name[nlen] = '\0';
        const vlmd_flag *f = vlmd_flag_find(name);
        if (!f)
            return vlmd_errorf(err, VLMD_ERR_USAGE, "unknown flag '--%s' (see --help)", name);
        if (!(f->roles & VLMD_ROLE_BIT(role)))
            return vlmd_errorf(err, VLMD_ERR_USAGE, "flag '--%s' is not read by %s", name,
                               vlmd_role_process_name(role));
        const char *value;
        if (eq) {
            value = eq + 1;
        } else if (f->type == VLMD_FLAG_BOOL) {
            value = "true"; /* a switch: its presence says it */
        } else {
            if (i + 1 >= argc)
                return vlmd_errorf(err, VLMD_ERR_USAGE, "flag '--%s' needs a value", name);
            value = argv[++i];
        }
        vlmd_status st = flag_set(cfg, f, value, err);
        if (st != VLMD_OK)
            return st;
    }
    return VLMD_OK;
}

static bool is_endpoint(const char *s)
{
    return strncmp(s, "ipc://", 6) == 0 || strncmp(s, "tcp://", 6) == 0 ||
           strncmp(s, "inproc://", 9) == 0;
}

vlmd_status vlmd_config_validate(const vlmd_config *cfg, vlmd_role role, vlmd_error *err)
{
    if (!cfg->model[0])
        return vlmd_errorf(err, VLMD_ERR_USAGE, "--model DIR is required");
    if (role != VLMD_ROLE_LAUNCHER && !cfg->router_endpoint[0])
        return vlmd_errorf(err, VLMD_ERR_USAGE,
                           "--router-endpoint is required for %s (the launcher sets it)",
                           vlmd_role_process_name(role));
    if (cfg->router_endpoint[0] && !is_endpoint(cfg->router_endpoint))
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG,
                           "--router-endpoint: '%s' is not ipc://PATH or tcp://HOST:PORT",
                           cfg->router_endpoint);
    if (cfg->heartbeat_timeout_ms < 3 * cfg->heartbeat_ms)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG,
                           "--heartbeat-timeout-ms %lld must be at least 3 x --heartbeat-ms %lld",
                           (long long)cfg->heartbeat_timeout_ms, (long long)cfg->heartbeat_ms);
    if (cfg->max_num_seqs > cfg->batch_max_tokens)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG,
                           "--max-num-seqs %lld is more than --batch-max-tokens %lld: every "
                           "running request takes one token of each step",
                           (long long)cfg->max_num_seqs, (long long)cfg->batch_max_tokens);
    if (cfg->kv_events_endpoint[0] && strncmp(cfg->kv_events_endpoint, "tcp://", 6) != 0 &&
        strncmp(cfg->kv_events_endpoint, "ipc://", 6) != 0)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG,
                           "--kv-events-endpoint: '%s' is not tcp://HOST:PORT or ipc://PATH",
                           cfg->kv_events_endpoint);
    if (cfg->kv_events_endpoint[0] && cfg->disable_prefix_cache)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG,
                           "--kv-events-endpoint publishes the prefix cache's changes: it "
                           "needs the prefix cache (drop --disable-prefix-cache)");
    if (cfg->cpu_device_mb > 0 && cfg->cpu_device_mb < 64) /* 0 is the spare memory */
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG,
                           "--cpu-device-mb %lld: give at least 64 MiB, or 0 for what the "
                           "machine can spare", (long long)cfg->cpu_device_mb);
    int ordinal, ordinals = vlmd_config_devices(cfg, vlmd_config_process_rank(cfg), &ordinal);
    if (ordinals < 0)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "--devices: '%s' is not a "
                           "comma-separated list of GPU ordinals", cfg->devices);
    int64_t processes = cfg->tensor_parallel_size * cfg->data_parallel_size;
    if (processes > 16)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "--tensor-parallel-size %lld times "
                           "--data-parallel-size %lld is more than 16 engine processes",
                           (long long)cfg->tensor_parallel_size,
                           (long long)cfg->data_parallel_size);
    if (ordinals && ordinals < processes)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "--devices names %d GPU(s) for "
                           "--tensor-parallel-size %lld x --data-parallel-size %lld: one per "
                           "rank", ordinals, (long long)cfg->tensor_parallel_size,
                           (long long)cfg->data_parallel_size);
    if (cfg->data_parallel_rank >= cfg->data_parallel_size)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG,
                           "--data-parallel-rank %lld is not below --data-parallel-size %lld",
                           (long long)cfg->data_parallel_rank,
                           (long long)cfg->data_parallel_size);
    uint64_t large_tokens;
    uint32_t large_engine;
    if (cfg->route_large_requests[0] && !vlmd_config_large_route(cfg, &large_tokens, &large_engine))
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG, "--route-large-requests: '%s' is not "
                           "TOKENS=ENGINE (a token count above 0 and an engine below "
                           "--data-parallel-size %lld)", cfg->route_large_requests,
                           (long long)cfg->data_parallel_size);
    if (cfg->rank >= cfg->tensor_parallel_size)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG,
                           "--rank %lld is not below --tensor-parallel-size %lld",
                           (long long)cfg->rank, (long long)cfg->tensor_parallel_size);
    if (cfg->restart_backoff_max_ms < cfg->restart_backoff_ms)
        return vlmd_errorf(err, VLMD_ERR_INVALID_ARG,
                           "--restart-backoff-max-ms %lld is less than --restart-backoff-ms %lld",
                           (long long)cfg->restart_backoff_max_ms,
                           (long long)cfg->restart_backoff_ms);
    return VLMD_OK;
}

int vlmd_config_devices(const vlmd_config *cfg, int64_t rank, int *ordinal)
{
    int n = 0;
    *ordinal = (int)rank;
    for (const char *p = cfg->devices; *p; n++) {
        char *end = NULL;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 255 || (*end && *end != ','))
            return -1;
        if (n == rank)
            *ordinal = (int)v;
        p = *end ? end + 1 : end;
    }
    return n;
}

int64_t vlmd_config_process_rank(const vlmd_config *cfg)
{
    return cfg->data_parallel_rank * cfg->tensor_parallel_size + cfg->rank;
}

bool vlmd_config_large_route(const vlmd_config *cfg, uint64_t *tokens, uint32_t *engine)
{
    const char *s = cfg->route_large_requests;
    char *end = NULL;
    if (!s[0] || s[0] < '0' || s[0] > '9')
        return false;
    unsigned long long t = strtoull(s, &end, 10);
    if (t == 0 || t > UINT32_MAX || *end != '=' || end[1] < '0' || end[1] > '9')
        return false;
    const char *g = end + 1;
    unsigned long e = strtoul(g, &end, 10);
    if (*end || (int64_t)e >= cfg->data_parallel_size)
        return false;
    *tokens = t;
    *engine = (uint32_t)e;
    return true;
}

void vlmd_served_model_name(const char *flag_value, const char *model_dir, char *out, size_t outsz)
{
    if (flag_value && flag_value[0]) {
        vlmd_strlcpy(out, flag_value, outsz);
        return;
    }
    size_t end = strlen(model_dir);
    while (end > 1 && model_dir[end - 1] == '/')
        end--;
    size_t start = end;
    while (start > 0 && model_dir[start - 1] != '/')
        start--;
    size_t n = end - start;
    if (n == 0) { /* "/" itself */
        vlmd_strlcpy(out, model_dir, outsz);
        return;
    }
    if (n >= outsz)
        n = outsz - 1;
    memcpy(out, model_dir + start, n);
    out[n] = '\0';
}

void vlmd_config_value_str(const vlmd_config *cfg, const vlmd_flag *f, char *out, size_t outsz)
{
    vlmd_config *c = (vlmd_config *)cfg;
    if (f->type == VLMD_FLAG_INT)
        snprintf(out, outsz, "%lld", (long long)*field_int(c, f));
    else if (f->type == VLMD_FLAG_FLOAT)
        snprintf(out, outsz, "%g", *field_double(c, f));
    else if (f->type == VLMD_FLAG_BOOL)
        vlmd_strlcpy(out, *field_bool(c, f) ? "true" : "false", outsz);
    else
        vlmd_strlcpy(out, *field_str(c, f) ? *field_str(c, f) : "", outsz);
}

void vlmd_config_print_help(vlmd_role role, const char *usage, void *stream)
{
    FILE *out = stream;
    fprintf(out, "usage: %s\n\nflags:\n", usage);
    for (const vlmd_flag *f = vlmd_flags; f->name; f++) {
        if (!(f->roles & VLMD_ROLE_BIT(role)))
            continue;
        char range[96] = "";
        if (f->type == VLMD_FLAG_INT)
            snprintf(range, sizeof range, " [%lld..%lld]", f->min, f->max);
        else if (f->type == VLMD_FLAG_FLOAT)
            snprintf(range, sizeof range, " [%g..%g]", f->fmin, f->fmax);
        else if (f->type == VLMD_FLAG_CHOICE)
            snprintf(range, sizeof range, " {%s}", f->choices);
        fprintf(out, "  --%s%s (default: \"%s\")\n      %s\n", f->name, range, f->default_value,
                f->help);
    }
}

void vlmd_config_parse_or_exit(vlmd_config *cfg, vlmd_role role, int argc, char **argv, int first)
{
    vlmd_error err = {0};
    bool help = false;
    vlmd_config_init_defaults(cfg);
    vlmd_status st = vlmd_config_parse(cfg, role, argc, argv, first, &help, &err);
    if (st == VLMD_OK && help) {
        char usage[128];
        snprintf(usage, sizeof usage, "%s%s --model DIR [flags]", vlmd_role_process_name(role),
                 role == VLMD_ROLE_LAUNCHER ? " serve" : "");
        vlmd_config_print_help(role, usage, stdout);
        vlmd_config_free(cfg);
        exit(0);
    }
    if (st == VLMD_OK)
        st = vlmd_config_validate(cfg, role, &err);
    if (st != VLMD_OK) {
        fprintf(stderr, "%s: %s\n", vlmd_role_process_name(role), err.msg);
        vlmd_config_free(cfg);
        exit(VLMD_EXIT_CONFIG);
    }
}

char **vlmd_config_child_argv(const vlmd_config *cfg, vlmd_role child, int *argc_out)
{
    size_t n = 0;
    for (const vlmd_flag *f = vlmd_flags; f->name; f++)
        n++;
    char **argv = calloc(n + 1, sizeof *argv);
    if (!argv)
        return NULL;
    int k = 0;
    for (const vlmd_flag *f = vlmd_flags; f->name; f++) {
        if (!(f->roles & VLMD_ROLE_BIT(child)))
            continue;
        char value[4096];
        vlmd_config_value_str(cfg, f, value, sizeof value);
        argv[k] = vlmd_asprintf("--%s=%s", f->name, value);
        if (!argv[k]) {
            vlmd_argv_free(argv);
            return NULL;
        }
        k++;
    }
    if (argc_out)
        *argc_out = k;
    return argv;
}

void vlmd_argv_free(char **argv)
{
    if (!argv)
        return;
    for (char **p = argv; *p; p++)
        free(*p);
    free(argv);
}

void vlmd_config_foreach(const vlmd_config *cfg, vlmd_role role, vlmd_config_visit_fn fn, void *ud)
{
    for (const vlmd_flag *f = vlmd_flags; f->name; f++) {
        if (!(f->roles & VLMD_ROLE_BIT(role)))
            continue;
        char value[4096];
        vlmd_config_value_str(cfg, f, value, sizeof value);
        fn(f->name, value, ud);
    }
}
