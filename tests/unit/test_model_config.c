/* test_model_config.c - both config.json shapes, against the fixtures. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_config.h"
#include "test_support.h"


Test(model_config, qwen2_vl_nested_shape)
{
    vlmd_model_config mc;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_config_load(test_fixture("qwen2_vl"), &mc, &err), VLMD_OK, "%s",
                 err.msg);
    cr_expect_eq(mc.arch, VLMD_ARCH_QWEN2_VL);
    cr_expect_eq(mc.text.hidden_size, 128);
    cr_expect_eq(mc.text.num_layers, 3);
    cr_expect_eq(mc.text.num_kv_heads, 2);
    cr_expect_eq(mc.text.head_dim, 32);
    cr_expect_eq(mc.text.max_position_embeddings, 4096);
    cr_expect_eq(mc.text.n_mrope_section, 3);
    cr_expect_eq(mc.text.mrope_section[1], 6);
    cr_expect_float_eq(mc.text.rope_theta, 1e6, 1e-3);
    cr_expect_eq(mc.text.eos_token_id, 1012);
    cr_expect(mc.has_vision);
    cr_expect_eq(mc.vision.embed_dim, 64);
    cr_expect_eq(mc.vision.intermediate_size, 128, "embed_dim * mlp_ratio");
    cr_expect_eq(mc.image_token_id, 1022);
}

Test(model_config, qwen2_5_vl_window_attention_fields)
{
    vlmd_model_config mc;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_config_load(test_fixture("qwen2_5_vl"), &mc, &err), VLMD_OK,
                 "%s", err.msg);
    cr_expect_eq(mc.arch, VLMD_ARCH_QWEN2_5_VL);
    cr_expect_eq(mc.vision.window_size, 56);
    cr_expect_eq(mc.vision.n_fullatt_blocks, 2);
    cr_expect_eq(mc.vision.fullatt_block_indexes[1], 3);
    cr_expect_eq(mc.vision.out_hidden_size, 128);
}

Test(model_config, qwen2_text_only_flat_shape)
{
    vlmd_model_config mc;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_config_load(test_fixture("qwen2"), &mc, &err), VLMD_OK, "%s",
                 err.msg);
    cr_expect_eq(mc.arch, VLMD_ARCH_QWEN2);
    cr_expect_not(mc.has_vision);
    cr_expect(mc.text.tie_word_embeddings);
    cr_expect_eq(mc.text.n_mrope_section, 0);
}

Test(model_config, older_flat_vl_shape_with_rope_scaling)
{
    const char *json =
        "{\"architectures\":[\"Qwen2VLForConditionalGeneration\"],\"model_type\":\"qwen2_vl\","
        "\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":2,"
        "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":300,"
        "\"max_position_embeddings\":2048,\"rope_theta\":1000.0,\"image_token_id\":299,"
        "\"rope_scaling\":{\"type\":\"mrope\",\"mrope_section\":[2,3,3]},"
        "\"vision_config\":{\"depth\":1,\"embed_dim\":32,\"hidden_size\":64,\"num_heads\":2,"
        "\"patch_size\":14,\"spatial_merge_size\":2,\"temporal_patch_size\":2}}";
    vlmd_model_config mc;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_config_parse(json, "inline", &mc, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(mc.text.head_dim, 16);
    cr_expect_eq(mc.text.mrope_section[0], 2);
    cr_expect_float_eq(mc.text.rope_theta, 1000.0, 1e-9);
    cr_expect_eq(mc.vision.intermediate_size, 128, "mlp_ratio defaults to 4");
}

Test(model_config, errors_name_the_field)
{
    struct {
        const char *json;
        const char *needle;
    } cases[] = {
        {"{", "invalid JSON"},
        {"[1]", "not a JSON object"},
        {"{\"architectures\":[\"LlamaForCausalLM\"]}", "'LlamaForCausalLM' is not supported"},
        {"{\"architectures\":[\"Qwen2ForCausalLM\"],\"intermediate_size\":1}", "'hidden_size'"},
        {"{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":\"64\"}",
         "'hidden_size' is not an integer"},
        {"{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":1,"
         "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"num_key_value_heads\":3,"
         "\"vocab_size\":9,\"max_position_embeddings\":9}",
         "not a multiple of num_key_value_heads"},
        {"{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":1,"
         "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"vocab_size\":9,"
         "\"max_position_embeddings\":9,\"rope_scaling\":{\"mrope_section\":[1,1,1]}}",
         "mrope_section sums to 3"},
        {"{\"architectures\":[\"Qwen2VLForConditionalGeneration\"],\"hidden_size\":64,"
         "\"intermediate_size\":1,\"num_hidden_layers\":1,\"num_attention_heads\":4,"
         "\"vocab_size\":9,\"max_position_embeddings\":9}",
         "'vision_config'"},
        {"{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":1,"
         "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":9,"
         "\"max_position_embeddings\":9}",
         "needs 'num_experts'"},
        {"{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":1,"
         "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":9,"
         "\"max_position_embeddings\":9,\"num_experts\":4,\"num_experts_per_tok\":5,"
         "\"moe_intermediate_size\":8}",
         "num_experts_per_tok 5 is more than num_experts 4"},
        {"{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":1,"
         "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":9,"
         "\"max_position_embeddings\":9,\"num_experts\":4,\"num_experts_per_tok\":2,"
         "\"moe_intermediate_size\":8,\"mlp_only_layers\":[2]}",
         "mlp_only_layers[0] is not an index below 2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        vlmd_model_config mc;
        vlmd_error err = {0};
        cr_expect_eq(vlmd_model_config_parse(cases[i].json, "cfg.json", &mc, &err), VLMD_ERR_MODEL,
                     "case %zu", i);
        cr_expect(strstr(err.msg, cases[i].needle), "case %zu: '%s' lacks '%s'", i, err.msg,
                  cases[i].needle);
        cr_expect(strstr(err.msg, "cfg.json"), "names the file");
    }
}

Test(model_config, missing_directory)
{
    vlmd_model_config mc;
    vlmd_error err = {0};
    cr_expect_eq(vlmd_model_config_load("/nonexistent/model", &mc, &err), VLMD_ERR_NOT_FOUND);
    cr_expect(strstr(err.msg, "/nonexistent/model/config.json"), "%s", err.msg);
}

Test(model_config, qwen3_as_published)
{
    vlmd_model_config mc;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_config_load(test_fixture("qwen3"), &mc, &err), VLMD_OK, "%s",
                 err.msg);
    cr_expect_eq(mc.arch, VLMD_ARCH_QWEN3);
    cr_expect_eq(mc.text.head_dim, 32, "from the config, not hidden / heads");
    cr_expect_eq(mc.text.num_heads * mc.text.head_dim, 192, "q wider than hidden");
    cr_expect(mc.text.qk_norm);
    cr_expect_not(mc.text.qkv_bias, "attention_bias false");
    cr_expect_not(mc.text.tie_word_embeddings);
    cr_expect_float_eq(mc.text.rope_theta, 1e6, 1e-3);
    cr_expect_eq(mc.text.num_experts, 0);
    cr_expect_not(vlmd_text_layer_is_moe(&mc.text, 0));
    cr_expect_not(mc.has_vision);
}

Test(model_config, qwen3_moe_experts_and_dense_layers)
{
    vlmd_model_config mc;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_config_load(test_fixture("qwen3_moe"), &mc, &err), VLMD_OK, "%s",
                 err.msg);
    cr_expect_eq(mc.arch, VLMD_ARCH_QWEN3_MOE);
    cr_expect_eq(mc.text.num_experts, 8);
    cr_expect_eq(mc.text.num_experts_per_tok, 2);
    cr_expect_eq(mc.text.moe_intermediate_size, 64);
    cr_expect(mc.text.norm_topk_prob);
    cr_expect_not(vlmd_text_layer_is_moe(&mc.text, 0), "mlp_only_layers [0]");
    cr_expect(vlmd_text_layer_is_moe(&mc.text, 1));
    cr_expect(vlmd_text_layer_is_moe(&mc.text, 2));
}

Test(model_config, qwen3_vl_nested_rope_scaling_and_vision)
{
    vlmd_model_config mc;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_config_load(test_fixture("qwen3_vl"), &mc, &err), VLMD_OK, "%s",
                 err.msg);
    cr_expect_eq(mc.arch, VLMD_ARCH_QWEN3_VL);
    cr_expect_eq(mc.text.hidden_size, 64);
    cr_expect(mc.text.qk_norm);
    cr_expect_eq(mc.text.n_mrope_section, 3);
    cr_expect_eq(mc.text.mrope_section[0], 6);
    cr_expect(mc.text.mrope_interleaved);
    cr_expect_float_eq(mc.text.rope_theta, 5e6, 1e-3);
    cr_expect(mc.has_vision);
    cr_expect_eq(mc.vision.embed_dim, 32);
    cr_expect_eq(mc.vision.out_hidden_size, 64);
    cr_expect_eq(mc.vision.intermediate_size, 64);
    cr_expect_eq(mc.vision.patch_size, 16);
    cr_expect_eq(mc.vision.act, VLMD_ACT_GELU_TANH);
    cr_expect_eq(mc.vision.num_position_embeddings, 64);
    cr_expect_eq(mc.vision.n_deepstack, 2);
    cr_expect_eq(mc.vision.deepstack_visual_indexes[1], 2);
    cr_expect_eq(mc.image_token_id, 1022);
}

/* transformers-5 writes rope_parameters; Qwen3-VL-MoE is Qwen3-VL's tower
 * in front of a Qwen3-MoE text model. */
Test(model_config, qwen3_vl_moe_with_rope_parameters)
{
    const char *json =
        "{\"architectures\":[\"Qwen3VLMoeForConditionalGeneration\"],\"image_token_id\":299,"
        "\"text_config\":{\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":4,"
        "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":32,\"vocab_size\":300,"
        "\"max_position_embeddings\":2048,\"num_experts\":16,\"num_experts_per_tok\":4,"
        "\"moe_intermediate_size\":32,\"decoder_sparse_step\":2,\"norm_topk_prob\":false,"
        "\"mlp_only_layers\":[],"
        "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":5000000.0,"
        "\"mrope_section\":[6,5,5],\"mrope_interleaved\":true}},"
        "\"vision_config\":{\"depth\":2,\"hidden_size\":32,\"out_hidden_size\":64,"
        "\"intermediate_size\":64,\"num_heads\":2,\"patch_size\":16,\"spatial_merge_size\":2,"
        "\"temporal_patch_size\":2,\"num_position_embeddings\":2304,"
        "\"deepstack_visual_indexes\":[1],\"hidden_act\":\"gelu_pytorch_tanh\"}}";
    vlmd_model_config mc;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_config_parse(json, "inline", &mc, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(mc.arch, VLMD_ARCH_QWEN3_VL_MOE);
    cr_expect_float_eq(mc.text.rope_theta, 5e6, 1e-3);
    cr_expect(mc.text.mrope_interleaved);
    cr_expect_eq(mc.text.num_experts, 16);
    cr_expect(mc.text.norm_topk_prob, "its router renormalises whatever the config says");
    cr_expect_not(vlmd_text_layer_is_moe(&mc.text, 0), "decoder_sparse_step 2");
    cr_expect(vlmd_text_layer_is_moe(&mc.text, 1));
    cr_expect_eq(mc.vision.num_position_embeddings, 2304);
    cr_expect_eq(mc.vision.n_deepstack, 1);
}

/* transformers 5 writes a text model's rope as rope_parameters at the top level,
 * with no rope_theta beside it; and the Qwen2.5-VL config it writes keeps its
 * M-RoPE sections there, inside text_config. */
Test(model_config, top_level_rope_parameters_as_transformers_5_writes_them)
{
    const char *json =
        "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"hidden_size\":64,"
        "\"intermediate_size\":128,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
        "\"num_key_value_heads\":2,\"head_dim\":32,\"vocab_size\":300,"
        "\"max_position_embeddings\":40960,\"num_experts\":8,\"num_experts_per_tok\":2,"
        "\"moe_intermediate_size\":32,\"norm_topk_prob\":true,"
        "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1000000.0}}";
    vlmd_model_config mc;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_config_parse(json, "inline", &mc, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(mc.arch, VLMD_ARCH_QWEN3_MOE);
    cr_expect_float_eq(mc.text.rope_theta, 1e6, 1e-3);
    cr_expect(vlmd_text_layer_is_moe(&mc.text, 0));
    const char *vl =
        "{\"architectures\":[\"Qwen2_5_VLForConditionalGeneration\"],\"image_token_id\":299,"
        "\"text_config\":{\"hidden_size\":64,\"intermediate_size\":128,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
        "\"vocab_size\":300,\"max_position_embeddings\":2048,\"rope_parameters\":"
        "{\"mrope_section\":[2,3,3],\"rope_theta\":1000000.0,\"rope_type\":\"default\","
        "\"type\":\"mrope\"}},"
        "\"vision_config\":{\"depth\":2,\"hidden_size\":32,\"out_hidden_size\":64,"
        "\"intermediate_size\":64,\"num_heads\":2,\"patch_size\":14,\"spatial_merge_size\":2,"
        "\"temporal_patch_size\":2,\"window_size\":112,\"fullatt_block_indexes\":[1],"
        "\"hidden_act\":\"silu\"}}";
    cr_assert_eq(vlmd_model_config_parse(vl, "inline", &mc, &err), VLMD_OK, "%s", err.msg);
    cr_expect_eq(mc.arch, VLMD_ARCH_QWEN2_5_VL);
    cr_expect_float_eq(mc.text.rope_theta, 1e6, 1e-3);
    cr_expect_eq(mc.text.mrope_section[0], 2);
    cr_expect_eq(mc.text.mrope_section[2], 3);
}

/* Feature k of DeepStack is added after text layer k: a config with more
 * features than text layers is refused, naming both counts. */
Test(model_config, more_deepstack_features_than_text_layers_are_refused)
{
    const char *json =
        "{\"architectures\":[\"Qwen3VLForConditionalGeneration\"],\"image_token_id\":299,"
        "\"text_config\":{\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":%d,"
        "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":32,\"vocab_size\":300,"
        "\"max_position_embeddings\":2048,\"rope_theta\":5000000,"
        "\"rope_scaling\":{\"rope_type\":\"default\",\"mrope_section\":[6,5,5]}},"
        "\"vision_config\":{\"depth\":4,\"hidden_size\":32,\"out_hidden_size\":64,"
        "\"intermediate_size\":64,\"num_heads\":2,\"patch_size\":16,\"spatial_merge_size\":2,"
        "\"temporal_patch_size\":2,\"num_position_embeddings\":64,"
        "\"deepstack_visual_indexes\":[0,1,2]}}";
    char text[2048];
    vlmd_model_config mc;
    vlmd_error err = {0};
    snprintf(text, sizeof text, json, 3);
    cr_expect_eq(vlmd_model_config_parse(text, "inline", &mc, &err), VLMD_OK, "%s", err.msg);
    snprintf(text, sizeof text, json, 2);
    cr_expect_eq(vlmd_model_config_parse(text, "inline", &mc, &err), VLMD_ERR_MODEL);
    cr_expect(strstr(err.msg, "3 deepstack_visual_indexes, but the text model has 2 layers"), "%s",
              err.msg);
}

Test(model_config, glm4_moe_as_published)
{
    vlmd_model_config mc;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_config_load(test_fixture("glm4_moe"), &mc, &err), VLMD_OK, "%s",
                 err.msg);
    const vlmd_text_config *t = &mc.text;
    cr_expect_eq(mc.arch, VLMD_ARCH_GLM4_MOE);
    cr_expect_eq(t->head_dim, 32, "explicit: heads x head_dim is not hidden");
    cr_expect_eq(t->rotary_dim, 16, "partial_rotary_factor 0.5");
    cr_expect(t->qkv_bias, "attention_bias");
    cr_expect_not(t->qk_norm, "use_qk_norm false");
    cr_expect_eq(t->num_experts, 8);
    cr_expect_eq(t->num_experts_per_tok, 2);
    cr_expect_eq(t->router, VLMD_ROUTER_SIGMOID);
    cr_expect(t->norm_topk_prob);
    cr_expect_eq(t->n_group, 1);
    cr_expect_eq(t->topk_group, 1);
    cr_expect_float_eq(t->routed_scaling_factor, 1.0, 1e-9);
    cr_expect_eq(t->shared_expert_size, 16, "moe_intermediate_size x n_shared_experts");
    cr_expect_not(vlmd_text_layer_is_moe(t, 0), "first_k_dense_replace 1");
    cr_expect(vlmd_text_layer_is_moe(t, 1));
    cr_expect(vlmd_text_layer_is_moe(t, 2));
    cr_expect_eq(t->num_layers, 3, "the MTP layer is not counted");
    cr_expect_eq(t->num_nextn_predict_layers, 1);
    cr_expect_float_eq(t->rms_norm_eps, 1e-5, 1e-12);
    cr_expect_eq(t->n_eos, 3);
    cr_expect_eq(t->eos_ids[0], 724);
    cr_expect_eq(t->eos_ids[1], 731);
    cr_expect_eq(t->eos_ids[2], 733);
}

Test(model_config, glm4_moe_routing_fields_and_refusals)
{
    const char *base = "{\"architectures\":[\"Glm4MoeForCausalLM\"],\"hidden_size\":64,"
                       "\"intermediate_size\":128,\"num_hidden_layers\":4,\"num_attention_heads\":4,"
                       "\"vocab_size\":9,\"max_position_embeddings\":9,\"head_dim\":32,"
                       "\"moe_intermediate_size\":16,\"num_experts_per_tok\":4,\"use_qk_norm\":true,"
                       "\"first_k_dense_replace\":2,\"n_shared_experts\":2,"
                       "\"routed_scaling_factor\":2.5,\"partial_rotary_factor\":0.5,";
    char json[1024];
    snprintf(json, sizeof json, "%s\"n_routed_experts\":16,\"n_group\":4,\"topk_group\":2}", base);
    vlmd_model_config mc;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_config_parse(json, "cfg.json", &mc, &err), VLMD_OK, "%s", err.msg);
    cr_expect(mc.text.qk_norm);
    cr_expect_eq(mc.text.n_group, 4);
    cr_expect_eq(mc.text.topk_group, 2);
    cr_expect_float_eq(mc.text.routed_scaling_factor, 2.5, 1e-9);
    cr_expect_eq(mc.text.shared_expert_size, 32);
    cr_expect_not(vlmd_text_layer_is_moe(&mc.text, 1));
    cr_expect(vlmd_text_layer_is_moe(&mc.text, 2));
    snprintf(json, sizeof json, "%s\"n_routed_experts\":16,\"n_group\":8,\"topk_group\":1}", base);
    cr_expect_eq(vlmd_model_config_parse(json, "cfg.json", &mc, &err), VLMD_ERR_MODEL,
                 "one group of 2 cannot give 4 experts");
    cr_expect(strstr(err.msg, "num_experts_per_tok 4"), "%s", err.msg);
    snprintf(json, sizeof json, "%s\"n_routed_experts\":16,\"n_group\":3,\"topk_group\":2}", base);
    cr_expect_eq(vlmd_model_config_parse(json, "cfg.json", &mc, &err), VLMD_ERR_MODEL);
}

Test(model_config, mixtral_as_published)
{
    vlmd_model_config mc;
    vlmd_error err = {0};
    cr_assert_eq(vlmd_model_config_load(test_fixture("mixtral"), &mc, &err), VLMD_OK, "%s",
                 err.msg);
    const vlmd_text_config *t = &mc.text;
    cr_expect_eq(mc.arch, VLMD_ARCH_MIXTRAL);
    cr_expect_eq(t->num_experts, 8, "num_local_experts");
    cr_expect_eq(t->num_experts_per_tok, 2);
    cr_expect_eq(t->moe_intermediate_size, 64, "each expert is intermediate_size wide");
    cr_expect_eq(t->router, VLMD_ROUTER_SOFTMAX);
    cr_expect(t->norm_topk_prob, "always renormalised");
    cr_expect(vlmd_text_layer_is_moe(t, 0) && vlmd_text_layer_is_moe(t, 1));
    cr_expect_not(t->qkv_bias);
    cr_expect_not(t->qk_norm);
    cr_expect_eq(t->rotary_dim, t->head_dim);
    cr_expect_eq(t->shared_expert_size, 0);
    cr_expect_eq(t->bos_token_id, 1);
    cr_expect_eq(t->n_eos, 1);
    cr_expect_eq(t->eos_ids[0], 2);
    const char *windowed = "{\"architectures\":[\"MixtralForCausalLM\"],\"hidden_size\":64,"
                           "\"intermediate_size\":64,\"num_hidden_layers\":2,"
                           "\"num_attention_heads\":4,\"vocab_size\":9,"
                           "\"max_position_embeddings\":32768,\"num_local_experts\":8,"
                           "\"num_experts_per_tok\":2,\"sliding_window\":4096}";
    cr_expect_eq(vlmd_model_config_parse(windowed, "cfg.json", &mc, &err), VLMD_ERR_MODEL);
    cr_expect(strstr(err.msg, "sliding_window 4096"), "%s", err.msg);
}
