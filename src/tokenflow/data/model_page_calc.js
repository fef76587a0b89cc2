// The model page's arithmetic in the browser, for configs read on the page (a bundled one or
// a pasted config.json). Each function follows one Python function and keeps its name in the
// comment above it; tests/test_model_page.py runs this file under node on every bundled config
// and on random configs and requires the Python values (tokenflow.model.hf_config,
// tokenflow.model.config, tokenflow.analysis.costmodel, tokenflow.analysis.roofline).
// The tables it reads (HF defaults, hardware presets, allowed names) come from Python as data.
(function (root) {
  "use strict";
  var TF = {};

  function has(d, k) { return Object.prototype.hasOwnProperty.call(d, k); }
  function isNum(v) { return typeof v === "number" && isFinite(v); }
  function isInt(v) { return typeof v === "number" && Math.floor(v) === v && isFinite(v); }
  function truthy(v) {
    if (v === null || v === undefined || v === false || v === 0 || v === "") return false;
    if (Array.isArray(v)) return v.length > 0;
    if (typeof v === "object") return Object.keys(v).length > 0;
    return true;
  }
  function fail(msg) { var e = new Error(msg); e.tfConfig = true; throw e; }
  function pyRepr(v) {
    if (typeof v === "string") return "'" + v + "'";
    if (v === null || v === undefined) return "None";
    if (v === true) return "True";
    if (v === false) return "False";
    return JSON.stringify(v);
  }

  // ---- tokenflow.model.hf_config._Reader
  function Reader(d, defaults) {
    this.d = d; this.defaults = defaults || {}; this.read = {}; this.problems = [];
  }
  Reader.prototype.g = function (key, dflt) {
    this.read[key] = true;
    var v = has(this.d, key) ? this.d[key] : this.defaults[key];
    return (v === null || v === undefined) ? (dflt === undefined ? null : dflt) : v;
  };
  Reader.prototype.first = function (keys, dflt) {
    var i, j, src = [this.d, this.defaults];
    for (i = 0; i < keys.length; i++) this.read[keys[i]] = true;
    for (j = 0; j < 2; j++) {
      for (i = 0; i < keys.length; i++) {
        var v = src[j][keys[i]];
        if (v !== null && v !== undefined) return v;
      }
    }
    return dflt === undefined ? null : dflt;
  };
  Reader.prototype.problem = function (key, why) {
    this.read[key] = true; this.problems.push([key, why]);
  };

  // ---- tokenflow.model.hf_config.parse_hf_config (allow_unsupported=True): ModelConfig fields
  // and the fields it cannot express (listed, never dropped silently).
  TF.parseHF = function (d0, T) {
    if (d0 === null || typeof d0 !== "object" || Array.isArray(d0))
      fail("config.json must be a JSON object {...}");
    var mt = has(d0, "model_type") ? d0.model_type : null;
    if (mt !== null && T.families.indexOf(mt) < 0)
      fail("model_type " + pyRepr(mt) + " is not supported (supported: " +
           T.families.join(", ") + ")");
    TF.T = T;
    var defaults = T.hf_defaults[mt] || {}, d = d0, k;
    if (mt === "gpt2") {
      var ren = function (src) {
        var out = {};
        for (var key in src) if (has(src, key)) out[T.gpt2_names[key] || key] = src[key];
        return out;
      };
      d = ren(d0); defaults = ren(defaults);
    }
    var g = new Reader(d, defaults);
    var kw = common(g, mt), parts = [attention(g, mt), windows(g, mt), moe(g, mt, T),
                                     rope(g, mt, T), mla(g), specialTokens(g)];
    parts.forEach(function (p) { for (var key in p) kw[key] = p[key]; });
    if (kw.intermediate_size === null) kw.intermediate_size = kw.moe_intermediate_size;
    ["is_encoder_decoder", "add_cross_attention"].forEach(function (key) {
      if (truthy(d[key])) g.problem(key, key + "=True: only decoder-only models are modelled");
    });
    var unknown = [];
    for (k in d) {
      if (!has(d, k) || g.read[k] || T.ignored.indexOf(k) >= 0) continue;
      if (T.ignored_prefixes.some(function (p) { return k.indexOf(p) === 0; })) continue;
      if (d[k] === null || d[k] === false) continue;
      unknown.push(k);
    }
    unknown.sort().forEach(function (key) {
      g.problems.push([key, key + " is not a field we can express"]);
    });
    var names = {};
    g.problems.forEach(function (p) { names[p[0]] = true; });
    kw.unsupported_fields = Object.keys(names).sort();
    kw.problems = g.problems.map(function (p) { return p[1]; });
    return kw;
  };

  function need(g, key) {
    var v = g.g(key);
    if (v === null) fail(key + " is missing: the model's shape needs it");
    return v;
  }

  function common(g, mt) {
    var hidden = need(g, "hidden_size"), nh = need(g, "num_attention_heads");
    var inter = g.g("intermediate_size") || (mt === "gpt2" ? 4 * hidden : null);
    var gpt2 = mt === "gpt2";
    var hd = g.g("head_dim") || (g.g("kv_lora_rank") ? null :
                                 (isInt(hidden) && isInt(nh) && nh > 0 ? Math.floor(hidden / nh)
                                  : null));
    return {
      vocab_size: need(g, "vocab_size"), hidden_size: hidden,
      num_hidden_layers: need(g, "num_hidden_layers"), num_attention_heads: nh,
      num_key_value_heads: g.g("num_key_value_heads") || nh, head_dim: hd,
      intermediate_size: inter,
      max_position_embeddings: g.g("max_position_embeddings", 2048),
      tie_word_embeddings: truthy(g.g("tie_word_embeddings", gpt2)),
      gated_mlp: !gpt2, norm_type: gpt2 ? "layernorm" : "rmsnorm",
      position_embedding_type: gpt2 ? "absolute" : "rope",
      mlp_bias: truthy(g.g("mlp_bias", false)) || mt === "gpt2" || mt === "gpt_oss",
      hidden_act: activation(g, mt),
      num_nextn_predict_layers: Math.trunc(g.g("num_nextn_predict_layers", 0)),
      rms_norm_eps: g.first(["rms_norm_eps", "layer_norm_eps"], 1e-6)
    };
  }

  function activation(g, mt) {
    var act = g.g("hidden_act", mt === "gpt2" ? "gelu_new" : "silu");
    if (TF.T.activations.indexOf(act) < 0) {
      g.problem("hidden_act", (mt === "gpt2" ? "activation_function" : "hidden_act") + " " +
                pyRepr(act) + " is not supported (supported: " + TF.T.activations.join(", ") +
                ")");
      return "silu";
    }
    return act;
  }

  function attention(g, mt) {
    var qkv = truthy(g.g("attention_bias", false)), out = qkv;
    if (mt === "qwen2") { qkv = true; out = false; }
    else if (mt === "qwen2_moe") { qkv = truthy(g.g("qkv_bias", true)); out = false; }
    else if (mt === "gpt2") { qkv = out = true; }
    return {attention_bias: qkv, attention_out_bias: out,
            qk_norm: mt === "qwen3" || mt === "qwen3_moe", attention_sinks: mt === "gpt_oss"};
  }

  function windows(g, mt) {
    var w = g.g("sliding_window"), types = g.g("layer_types"), L = g.g("num_hidden_layers");
    var i;
    if (["qwen2", "qwen3", "qwen2_moe", "qwen3_moe"].indexOf(mt) >= 0) {
      var use = truthy(g.g("use_sliding_window", false));
      var first = g.g("max_window_layers", 28);
      w = use && truthy(w) ? w : null;
      if (types === null && w !== null) {
        if (mt === "qwen2" || mt === "qwen3") {
          types = [];
          for (i = 0; i < L; i++) types.push(i >= first ? "sliding_attention" : "full_attention");
        } else if (mt === "qwen2_moe") {
          types = [];
          for (i = 0; i < L; i++)
            types.push(i % 2 === 0 && i < first ? "sliding_attention" : "full_attention");
        }
      }
    } else if (mt === "gpt_oss" && types === null && w !== null) {
      types = [];
      for (i = 0; i < L; i++) types.push(i % 2 === 0 ? "sliding_attention" : "full_attention");
    }
    if (types !== null) {
      types = types.slice();
      if (w === null || types.indexOf("sliding_attention") < 0) { w = null; types = null; }
      else if (types.indexOf("full_attention") < 0) types = null;
    }
    return {sliding_window: w, layer_types: types};
  }

  function moe(g, mt, T) {
    var experts = Math.trunc(g.first(["num_local_experts", "n_routed_experts", "num_experts"], 0));
    var k = g.first(["num_experts_per_tok", "experts_per_token"]);
    if (k === null && experts && mt === "deepseek_v2")
      g.problem("num_experts_per_tok", "num_experts_per_tok is missing: DeepseekV2Config " +
                "has no default for it (None; its router cannot run)");
    k = k === null ? 2 : k;
    var inter = g.g("intermediate_size");
    var scoring = g.g("scoring_func", mt === "deepseek_v3" ? "sigmoid" : "softmax");
    if (scoring !== "softmax" && scoring !== "sigmoid") {
      g.problem("scoring_func", "scoring_func " + pyRepr(scoring) +
                " is not modelled (softmax, sigmoid)");
      scoring = "softmax";
    }
    var method = g.g("topk_method", mt === "deepseek_v2" ? "greedy" : "noaux_tc");
    var allowed = T.family_topk_methods[mt] || [method];
    if (allowed.indexOf(method) < 0) {
      g.problem("topk_method", "topk_method " + pyRepr(method) + " is not modelled for " +
                "model_type " + pyRepr(mt) + " (HF's router implements " + allowed.join(", ") +
                ")");
      method = allowed[0];
    }
    var renorm = mt === "mixtral" || mt === "gpt_oss" ||
        (mt === null && has(g.d, "num_local_experts"));
    var kw = {
      num_experts: experts, num_experts_per_tok: experts ? Math.trunc(k) : 0,
      moe_intermediate_size: g.g("moe_intermediate_size") || inter || 1,
      num_shared_experts: experts ? Math.trunc(g.g("n_shared_experts") || 0) : 0,
      first_k_dense_replace: Math.trunc(g.g("first_k_dense_replace", 0)),
      moe_layer_freq: Math.trunc(g.g("moe_layer_freq", 1)), scoring_func: scoring,
      norm_topk_prob: renorm ? true : truthy(g.g("norm_topk_prob", false)),
      n_group: Math.trunc(g.g("n_group") || 1), topk_group: Math.trunc(g.g("topk_group") || 1),
      topk_method: method, router_bias: mt === "gpt_oss" && experts > 0,
      shared_expert_gate: false
    };
    g.g("routed_scaling_factor");
    if ((mt === "qwen2_moe" || mt === "qwen3_moe") && experts) {
      var moeI = g.g("moe_intermediate_size"), sharedI = g.g("shared_expert_intermediate_size", 0);
      if (sharedI % moeI)
        g.problem("shared_expert_intermediate_size", "shared_expert_intermediate_size (" +
                  sharedI + ") must be a multiple of moe_intermediate_size (" + moeI + ")");
      else { kw.num_shared_experts = sharedI / moeI; kw.shared_expert_gate = sharedI > 0; }
      var dense = (g.g("mlp_only_layers", []) || []).slice().sort(function (a, b) {
        return a - b; });
      var step = g.g("decoder_sparse_step", 1), ok = step === 1;
      dense.forEach(function (v, i) { if (v !== i) ok = false; });
      if (!ok)
        g.problem(step === 1 ? "mlp_only_layers" : "decoder_sparse_step",
                  "only 'first k layers dense, the rest MoE' is modelled, got mlp_only_layers=" +
                  JSON.stringify(dense) + ", decoder_sparse_step=" + step);
      kw.first_k_dense_replace = dense.length;
    }
    return kw;
  }

  function rope(g, mt, T) {
    var dr = T.default_rope[mt] || [{}, 10000.0];
    var src = g.g("rope_parameters") || g.g("rope_scaling") || dr[0], r = {}, key;
    for (key in src) if (has(src, key)) r[key] = src[key];
    var theta = r.rope_theta || g.g("rope_theta") || dr[1];
    var kind = r.rope_type || r.type || "default";
    delete r.rope_theta; delete r.rope_type; delete r.type;
    if (mt === "gpt2") return {};
    var prf = has(r, "partial_rotary_factor") ? r.partial_rotary_factor
        : g.g("partial_rotary_factor", 1.0);
    delete r.partial_rotary_factor;
    if (prf !== 1)
      g.problem("partial_rotary_factor", "partial_rotary_factor != 1 is not implemented " +
                "(rope_parameters)");
    if (!has(T.rope_types, kind)) {
      g.problem("rope_parameters", "rope_type " + pyRepr(kind) + " is not implemented " +
                "(supported: " + Object.keys(T.rope_types).sort().join(", ") + ")");
    }
    return {rope_theta: theta};
  }

  function mla(g) {
    var names = ["q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                 "v_head_dim"], out = {};
    names.forEach(function (n) { out[n] = g.g(n); });
    var qk = g.g("qk_head_dim");
    if (out.kv_lora_rank === null) {
      names.forEach(function (n) {
        if (out[n] !== null) g.problem(n, n + " without kv_lora_rank (not MLA) is not modelled");
      });
      return {q_lora_rank: null, kv_lora_rank: null, qk_rope_head_dim: null,
              qk_nope_head_dim: null, v_head_dim: null};
    }
    if (qk !== null && out.qk_nope_head_dim !== null && out.qk_rope_head_dim !== null &&
        qk !== out.qk_nope_head_dim + out.qk_rope_head_dim)
      fail("qk_head_dim (" + qk + ") must equal qk_nope_head_dim + qk_rope_head_dim (" +
           out.qk_nope_head_dim + " + " + out.qk_rope_head_dim + ")");
    return out;
  }

  function specialTokens(g) {
    g.g("eos_token_id"); g.g("pad_token_id"); g.g("bos_token_id");
    return {};
  }

  // ---- tokenflow.model.config.ModelConfig.__post_init__ / validate: the checks on the fields
  // the counts read (each error names the field, as Python's does).
  TF.checkConfig = function (c) {
    if (c.head_dim === null && c.kv_lora_rank !== null) c.head_dim = c.qk_rope_head_dim;
    if (c.head_dim === null) {
      if (!isInt(c.num_attention_heads) || c.num_attention_heads < 1)
        fail("num_attention_heads must be an int >= 1, got " + pyRepr(c.num_attention_heads));
      if (c.hidden_size % c.num_attention_heads !== 0)
        fail("hidden_size (" + c.hidden_size + ") must be divisible by num_attention_heads (" +
             c.num_attention_heads + ") when head_dim is not given");
      c.head_dim = c.hidden_size / c.num_attention_heads;
    }
    if (c.kv_lora_rank !== null) {
      var m = ["kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"];
      if (c.q_lora_rank !== null) m.push("q_lora_rank");
      m.forEach(function (n) {
        if (!isInt(c[n]) || typeof c[n] === "boolean" || c[n] < 1)
          fail(n + " must be an int >= 1 for MLA, got " + pyRepr(c[n]));
      });
    }
    var ge1 = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "intermediate_size", "moe_intermediate_size",
               "max_position_embeddings", "n_group", "topk_group", "moe_layer_freq"];
    var ge0 = ["num_experts", "num_experts_per_tok", "num_shared_experts",
               "first_k_dense_replace", "num_nextn_predict_layers"];
    ge1.concat(ge0).forEach(function (n) {
      var v = c[n];
      if (!isInt(v)) fail(n + " must be an int, got " + pyRepr(v));
      var lo = ge1.indexOf(n) >= 0 ? 1 : 0;
      if (v < lo) fail(n + " must be >= " + lo + ", got " + v);
    });
    if (c.num_attention_heads % c.num_key_value_heads !== 0)
      fail("num_key_value_heads (" + c.num_key_value_heads + ") must divide " +
           "num_attention_heads (" + c.num_attention_heads + ")");
    if (c.head_dim % 2 !== 0) fail("head_dim must be even for RoPE, got " + c.head_dim);
    if (c.num_experts > 0) {
      if (!(1 <= c.num_experts_per_tok && c.num_experts_per_tok <= c.num_experts))
        fail("num_experts_per_tok must be in [1, num_experts=" + c.num_experts + "], got " +
             c.num_experts_per_tok);
      if (c.num_experts % c.n_group !== 0)
        fail("n_group (" + c.n_group + ") must divide num_experts (" + c.num_experts + ")");
      if (!(1 <= c.topk_group && c.topk_group <= c.n_group))
        fail("topk_group must be in [1, n_group=" + c.n_group + "], got " + c.topk_group);
    }
    var w = c.sliding_window;
    if (w !== null && (!isInt(w) || w < 1))
      fail("sliding_window must be None or an int >= 1, got " + pyRepr(w));
    if (c.layer_types !== null) {
      var bad = c.layer_types.length !== c.num_hidden_layers || c.layer_types.some(function (t) {
        return t !== "full_attention" && t !== "sliding_attention"; });
      if (bad) fail("layer_types must list " + c.num_hidden_layers + " values from " +
                    "('full_attention', 'sliding_attention')");
    }
    if (c.kv_lora_rank !== null && (c.attention_bias || c.attention_out_bias))
      fail("attention_bias is not modelled for MLA attention");
    return c;
  };

  // ModelConfig.layer_is_moe / layer_is_sliding
  function layerIsMoe(c, i) {
    return c.num_experts > 0 && i >= c.first_k_dense_replace && i % c.moe_layer_freq === 0;
  }
  function layerIsSliding(c, i) {
    if (c.layer_types !== null) return c.layer_types[i] === "sliding_attention";
    return c.sliding_window !== null;
  }
  TF.numMoeLayers = function (c) {
    var n = 0;
    for (var i = 0; i < c.num_hidden_layers; i++) n += layerIsMoe(c, i) ? 1 : 0;
    return n;
  };
  TF.numSlidingLayers = function (c) {
    var n = 0;
    for (var i = 0; i < c.num_hidden_layers; i++) n += layerIsSliding(c, i) ? 1 : 0;
    return n;
  };

  // ---- tokenflow.analysis.costmodel
  var PARTS = ["embedding", "attention", "dense_ffn", "routed_experts", "shared_experts",
               "router", "norms", "lm_head"];
  TF.PARTS = PARTS;
  function countable(c) {
    if (c.unsupported_fields.length)
      fail("config dropped HF fields " + c.unsupported_fields.join(", ") +
           ": counts would be wrong");
  }
  function count(name, v, lo) {
    if (!isInt(v) || v < lo) fail(name + " must be an int >= " + lo + ", got " + pyRepr(v));
  }
  function ffnParams(c, I) {
    var H = c.hidden_size, nIn = c.gated_mlp ? 2 : 1;
    return (nIn + 1) * H * I + (c.mlp_bias ? nIn * I + H : 0);
  }
  function normParams(c, w) { return w * (c.norm_type === "layernorm" ? 2 : 1); }
  function attnParams(c) {
    var H = c.hidden_size, D = c.head_dim, nh = c.num_attention_heads,
        nkv = c.num_key_value_heads;
    if (c.kv_lora_rank === null) {
      var n = 2 * H * nh * D + 2 * H * nkv * D;
      n += (nh * D + 2 * nkv * D) * (c.attention_bias ? 1 : 0) + H * (c.attention_out_bias ? 1 : 0);
      return n + 2 * D * (c.qk_norm ? 1 : 0) + nh * (c.attention_sinks ? 1 : 0);
    }
    var dq = c.qk_nope_head_dim + c.qk_rope_head_dim;
    var q = c.q_lora_rank === null ? H * nh * dq
        : H * c.q_lora_rank + c.q_lora_rank + c.q_lora_rank * nh * dq;
    var kv = H * (c.kv_lora_rank + c.qk_rope_head_dim) + c.kv_lora_rank +
        c.kv_lora_rank * nh * (c.qk_nope_head_dim + c.v_head_dim);
    return q + kv + nh * c.v_head_dim * H;
  }
  function moeParams(c) {
    var H = c.hidden_size, E = c.num_experts;
    var shared = c.num_shared_experts ? ffnParams(c, c.num_shared_experts *
                                                  c.moe_intermediate_size) : 0;
    return {routed_experts: E * ffnParams(c, c.moe_intermediate_size),
            shared_experts: shared + H * (c.shared_expert_gate ? 1 : 0),
            router: E * H + E * (c.router_bias ? 1 : 0)};
  }
  // param_breakdown
  TF.paramBreakdown = function (c) {
    countable(c);
    var H = c.hidden_size, V = c.vocab_size, out = {};
    PARTS.forEach(function (k) { out[k] = 0; });
    out.embedding = V * H + (c.position_embedding_type === "absolute" ?
                             c.max_position_embeddings * H : 0);
    out.lm_head = c.tie_word_embeddings ? 0 : V * H;
    out.norms = normParams(c, H) * (2 * c.num_hidden_layers + 1);
    out.attention = attnParams(c) * c.num_hidden_layers;
    var moeLayers = TF.numMoeLayers(c);
    out.dense_ffn = ffnParams(c, c.intermediate_size) * (c.num_hidden_layers - moeLayers);
    if (c.num_experts) {
      var m = moeParams(c);
      for (var k in m) out[k] = m[k] * moeLayers;
    }
    out.total = PARTS.reduce(function (s, k) { return s + out[k]; }, 0);
    return out;
  };
  // active_param_breakdown (both tables counted, the default)
  TF.activeParams = function (c) {
    var out = TF.paramBreakdown(c);
    if (c.num_experts)
      out.routed_experts = Math.floor(out.routed_experts * c.num_experts_per_tok /
                                      c.num_experts);
    return PARTS.reduce(function (s, k) { return s + out[k]; }, 0);
  };
  function kvShare(c, tp) {
    if (c.kv_lora_rank !== null) return 1.0;
    var nkv = c.num_key_value_heads;
    if (nkv % tp && tp % nkv)
      fail("tp_size (" + tp + ") must divide num_key_value_heads (" + nkv +
           ") or be a multiple of it");
    return Math.max(nkv / tp, 1) / nkv;
  }
  function kvProjParams(c) {
    var H = c.hidden_size;
    if (c.kv_lora_rank !== null)
      return H * (c.kv_lora_rank + c.qk_rope_head_dim) + c.kv_lora_rank;
    var kv = c.num_key_value_heads * c.head_dim;
    return 2 * H * kv + 2 * kv * (c.attention_bias ? 1 : 0);
  }
  function attentionParamsPerDevice(c, tp, pb) {
    var kv = kvProjParams(c) * c.num_hidden_layers;
    return (pb.attention - kv) / tp + kv * kvShare(c, tp);
  }
  function kvLayerBytes(c, b, tp) {
    if (c.kv_lora_rank !== null) return (c.kv_lora_rank + c.qk_rope_head_dim) * b;
    return 2 * c.num_key_value_heads * kvShare(c, tp) * c.head_dim * b;
  }
  // kv_cache_bytes
  TF.kvCacheBytes = function (c, batch, ctx, b, tp) {
    countable(c);
    count("batch", batch, 1); count("context_len", ctx, 1); count("tp_size", tp, 1);
    var per = kvLayerBytes(c, b, tp), tokens = 0;
    for (var i = 0; i < c.num_hidden_layers; i++)
      tokens += layerIsSliding(c, i) ? Math.min(ctx, c.sliding_window) : ctx;
    return Math.trunc(batch * tokens * per);
  };
  // kv_cache_bytes_per_token (context_len=None)
  TF.kvBytesPerToken = function (c, b) {
    countable(c);
    return Math.trunc(c.num_hidden_layers * kvLayerBytes(c, b, 1));
  };
  // weight_bytes_per_device
  TF.weightBytesPerDevice = function (c, tp, ep, b) {
    var pb = TF.paramBreakdown(c);
    count("tp_size", tp, 1); count("ep_size", ep, 1);
    if (c.num_attention_heads % tp)
      fail("tp_size (" + tp + ") must divide num_attention_heads (" + c.num_attention_heads +
           ")");
    if (c.num_experts && c.num_experts % ep)
      fail("ep_size (" + ep + ") must divide num_experts (" + c.num_experts + ")");
    var t = (pb.embedding + pb.dense_ffn + pb.shared_experts + pb.lm_head) / tp;
    t += attentionParamsPerDevice(c, tp, pb);
    var out = {tensor_parallel: t * b, expert_parallel: pb.routed_experts / ep * b,
               replicated: (pb.norms + pb.router) * b};
    out.total = out.tensor_parallel + out.expert_parallel + out.replicated;
    return out;
  };
  // max_batch_size (memory_fraction 0.9)
  TF.maxBatchSize = function (c, ctx, mem, tp, ep, b, kvb) {
    var free = 0.9 * mem - TF.weightBytesPerDevice(c, tp, ep, b).total;
    var perSeq = TF.kvCacheBytes(c, 1, ctx, kvb, tp);
    return Math.max(Math.trunc(Math.floor(free / perSeq)), 0);
  };
  // expected_experts_touched
  function expectedExpertsTouched(E, K, T) { return E * (1 - Math.pow(1 - K / E, T)); }
  // forward_weight_bytes (total)
  function forwardWeightBytes(c, tokens, b, tp, ep) {
    TF.weightBytesPerDevice(c, tp, ep, b);
    var p = TF.paramBreakdown(c);
    var table = c.tie_word_embeddings ? 0 : c.vocab_size * c.hidden_size;
    var out = {dense_ffn: p.dense_ffn * b / tp, shared_experts: p.shared_experts * b / tp,
               lm_head: p.lm_head * b / tp};
    out.attention = attentionParamsPerDevice(c, tp, p) * b;
    out.embedding = (p.embedding - table + tokens * c.hidden_size) / tp * b;
    out.norms = p.norms * b; out.router = p.router * b; out.routed_experts = 0.0;
    if (c.num_experts) {
      var hit = expectedExpertsTouched(c.num_experts, c.num_experts_per_tok,
                                       tokens * Math.max(Math.floor(ep / tp), 1)) / c.num_experts;
      out.routed_experts = p.routed_experts / ep * b * hit;
    }
    return PARTS.reduce(function (s, k) { return s + out[k]; }, 0);
  }
  // forward_bytes
  TF.forwardBytes = function (c, newTokens, cached, batch, b, kvb, tp, ep) {
    var w = forwardWeightBytes(c, batch * newTokens, b, tp, ep);
    return w + TF.kvCacheBytes(c, batch, cached + newTokens, kvb, tp);
  };

  // expected_nodes_per_token: distinct nodes a token's K experts sit on, under node-limited
  // routing (max_nodes_per_token M) or else the config's group limit (topk_group of n_group)
  function combinations(n, k) {
    var out = [], cur = [];
    (function rec(start) {
      if (cur.length === k) { out.push(cur.slice()); return; }
      for (var i = start; i < n; i++) { cur.push(i); rec(i + 1); cur.pop(); }
    })(0);
    return out;
  }
  function missProb(s, n, K) {          // C(s - n, K) / C(s, K)
    if (s - n < K) return 0;
    var p = 1;
    for (var i = 0; i < K; i++) p *= (s - n - i) / (s - i);
    return p;
  }
  function checkNodeLayout(ep, G) {
    count("gpus_per_node", G, 1);
    if (ep % G && G % ep)
      fail("ep_size (" + ep + ") must be a multiple or divisor of gpus_per_node (" + G + ")");
  }
  TF.expectedNodesPerToken = function (c, ep, G, M) {
    count("ep_size", ep, 1);
    checkNodeLayout(ep, G);
    var E = c.num_experts, K = c.num_experts_per_tok, N = Math.max(Math.floor(ep / G), 1);
    var node = [], e, j, units = [], pick;
    for (e = 0; e < E; e++) node.push(Math.floor(e * N / E));
    if (M !== null) count("max_nodes_per_token", M, 1);
    if (M !== null && M < N) {
      for (j = 0; j < N; j++) units.push(node.map(function (x, i) { return x === j ? i : -1; })
                                         .filter(function (i) { return i >= 0; }));
      pick = M;
    } else if (M === null && c.n_group > 1 && c.topk_group < c.n_group) {
      var size = Math.floor(E / c.n_group);
      for (j = 0; j < c.n_group; j++) {
        var u = [];
        for (e = j * size; e < (j + 1) * size; e++) u.push(e);
        units.push(u);
      }
      pick = c.topk_group;
    } else {
      var all = [];
      for (e = 0; e < E; e++) all.push(e);
      units = [all]; pick = 1;
    }
    var total = 0.0, sets = 0;
    combinations(units.length, pick).forEach(function (chosen) {
      var held = {}, s = 0, key;
      chosen.forEach(function (ui) {
        units[ui].forEach(function (x) { held[node[x]] = (held[node[x]] || 0) + 1; });
      });
      for (key in held) s += held[key];
      if (s < K) fail("the routing limit leaves " + s + " experts, fewer than " +
                      "num_experts_per_tok (" + K + ")");
      for (key in held) total += 1 - missProb(s, held[key], K);
      sets += 1;
    });
    return total / sets;
  };
  // moe_comm_bytes_per_token with gpus_per_node (_link_elements): elements one token sends
  // over each link in one direction, along the hierarchical (prefill) or direct (decode) path
  function linkElements(c, ep, G, M, path) {
    checkNodeLayout(ep, G);
    var N = Math.max(Math.floor(ep / G), 1), K = c.num_experts_per_tok, H = c.hidden_size;
    var n = TF.expectedNodesPerToken(c, ep, G, M);
    if (path === "direct" && N > 1)
      return {nodes_per_token: n, scale_out: K * (ep - 1) / ep * H, scale_up: 0.0};
    var Gu = Math.min(G, ep);
    return {nodes_per_token: n, scale_out: n * (N - 1) / N * H, scale_up: K * (Gu - 1) / Gu * H};
  }

  // ---- tokenflow.analysis.roofline
  function attnProjFlops(c) {
    var H = c.hidden_size, D = c.head_dim, nh = c.num_attention_heads,
        nkv = c.num_key_value_heads;
    if (c.kv_lora_rank === null) return 2 * (2 * H * nh * D + 2 * H * nkv * D);
    var dq = c.qk_nope_head_dim + c.qk_rope_head_dim;
    var q = c.q_lora_rank === null ? H * nh * dq : c.q_lora_rank * (H + nh * dq);
    var kv = H * (c.kv_lora_rank + c.qk_rope_head_dim) +
        c.kv_lora_rank * nh * (c.qk_nope_head_dim + c.v_head_dim);
    return 2 * (q + kv + nh * c.v_head_dim * H);
  }
  function attentionWidths(c, S) {
    if (c.kv_lora_rank === null) return [c.head_dim, c.head_dim];
    if (S === 1) return [c.kv_lora_rank + c.qk_rope_head_dim, c.kv_lora_rank];
    return [c.qk_nope_head_dim + c.qk_rope_head_dim, c.v_head_dim];
  }
  // _keys_met: (query, key) pairs a causal kernel computes, sliding windows capped
  function keysMet(past, S, W) {
    var lo = past + 1, hi = past + S;
    if (W === null || hi <= W) return Math.floor((lo + hi) * S / 2);
    if (lo >= W) return W * S;
    var under = W - lo;
    return Math.floor((lo + W - 1) * under / 2) + W * (S - under);
  }
  function ffnMatmulParams(c, I) { return (c.gated_mlp ? 3 : 2) * c.hidden_size * I; }
  // forward_flops (causal=True)
  TF.forwardFlops = function (c, batch, S, past, logits) {
    countable(c);
    var T = batch * S, H = c.hidden_size, wd = attentionWidths(c, S), out = {
      attention_proj: 0, attention_scores: 0, dense_ffn: 0, routed_experts: 0,
      shared_experts: 0, router: 0, lm_head: 0};
    var proj = attnProjFlops(c);
    for (var i = 0; i < c.num_hidden_layers; i++) {
      var keys = keysMet(past, S, layerIsSliding(c, i) ? c.sliding_window : null);
      out.attention_proj += T * proj;
      out.attention_scores += batch * keys * 2 * c.num_attention_heads * (wd[0] + wd[1]);
      if (!layerIsMoe(c, i)) { out.dense_ffn += T * 2 * ffnMatmulParams(c, c.intermediate_size);
                               continue; }
      out.routed_experts += T * c.num_experts_per_tok * 2 *
          ffnMatmulParams(c, c.moe_intermediate_size);
      out.shared_experts += T * 2 * ffnMatmulParams(c, c.num_shared_experts *
                                                    c.moe_intermediate_size);
      out.router += T * 2 * c.num_experts * H;
    }
    out.lm_head = 2 * H * c.vocab_size * (logits === "all" ? T : batch);
    out.total = out.attention_proj + out.attention_scores + out.dense_ffn + out.routed_experts +
        out.shared_experts + out.router + out.lm_head;
    return out;
  };
  // roofline
  TF.roofline = function (c, hw, phase, batch, ctx, o) {
    count("batch", batch, 1); count("context_len", ctx, 1);
    var tp = o.tp_size, ep = o.ep_size, b = o.bytes_per_param;
    var perSeq = phase === "decode" ? 1 : ctx, T = batch * perSeq;
    var f = phase === "decode" ? TF.forwardFlops(c, 1, 1, ctx - 1, "all")
        : TF.forwardFlops(c, 1, ctx, 0, "last");
    var flops = batch * f.total / tp, attn = batch * f.attention_scores / tp;
    var mem = TF.forwardBytes(c, perSeq, ctx - perSeq, batch, b, o.kv_bytes_per_element, tp, ep);
    var bd = o.dispatch_bytes_per_element === null ? b : o.dispatch_bytes_per_element;
    var up = 2 * c.num_hidden_layers * 2 * (tp - 1) / tp * T * c.hidden_size * b, out = 0.0;
    if (c.num_experts && ep > 1) {
      var links = linkElements(c, ep, hw.gpus_per_node, o.max_nodes_per_token,
                               phase === "decode" ? "direct" : "hierarchical");
      var nm = TF.numMoeLayers(c);
      var upTok = links.scale_up * bd + links.scale_up * o.combine_bytes_per_element;
      var outTok = links.scale_out * bd + links.scale_out * o.combine_bytes_per_element;
      up += upTok * T * nm;
      out = outTok * T * nm;
    }
    var sec = function (n, bw) {
      if (n === 0) return 0.0;
      if (bw <= 0) fail("the step needs a link this hardware spec does not have (bandwidth 0)");
      return n / bw;
    };
    var upS = sec(up, hw.scale_up_bandwidth), outS = sec(out, hw.scale_out_bandwidth);
    var compute = (flops - attn) / hw.peak_flops[o.dtype] + attn / hw.peak_flops[o.attention_dtype];
    var times = {compute: compute, memory: mem / hw.memory_bandwidth, comm: Math.max(upS, outS)};
    var step = Math.max(times.compute, times.memory, times.comm);
    var bound = ["compute", "memory", "comm"].filter(function (k) { return times[k] === step; })[0];
    return {flops: flops, attention_flops: attn, memory_bytes: mem, scale_up_bytes: up,
            scale_out_bytes: out, compute_s: times.compute, memory_s: times.memory,
            comm_s: times.comm, scale_up_s: upS, scale_out_s: outS, step_s: step, bound: bound,
            link: bound === "comm" ? (outS >= upS ? "scale_out" : "scale_up") : null,
            tokens_per_s: T / step};
  };

  // ---- what the page shows for one config and one setting of the controls (tokenflow.viz.
  // model_page.page_numbers computes the same dict in Python).
  TF.PRECISIONS = {
    bf16: {dtype: "bf16", attention_dtype: "bf16", bytes_per_param: 2, kv_bytes_per_element: 2,
           dispatch_bytes_per_element: 2, combine_bytes_per_element: 2},
    fp8: {dtype: "fp8", attention_dtype: "bf16", bytes_per_param: 1, kv_bytes_per_element: 2,
          dispatch_bytes_per_element: 1, combine_bytes_per_element: 2}
  };
  TF.numbers = function (c, hw, s) {
    var p = TF.PRECISIONS[s.precision], r = {};
    r.moe_layers = TF.numMoeLayers(c);
    r.sliding_layers = TF.numSlidingLayers(c);
    r.kv_bytes_per_token = TF.kvBytesPerToken(c, p.kv_bytes_per_element);
    r.params_total = TF.paramBreakdown(c).total;
    r.params_active = TF.activeParams(c);
    var w = TF.weightBytesPerDevice(c, s.tp, s.ep, p.bytes_per_param);
    r.weights_tp = w.tensor_parallel; r.weights_ep = w.expert_parallel;
    r.weights_replicated = w.replicated; r.weights = w.total;
    r.kv_cache = TF.kvCacheBytes(c, s.batch, s.context, p.kv_bytes_per_element, s.tp);
    r.memory_used = r.weights + r.kv_cache;
    r.memory_budget = 0.9 * hw.memory_bytes;
    r.fits = r.memory_used <= r.memory_budget;
    r.max_batch = TF.maxBatchSize(c, s.context, hw.memory_bytes, s.tp, s.ep, p.bytes_per_param,
                                  p.kv_bytes_per_element);
    var o = {tp_size: s.tp, ep_size: s.ep, max_nodes_per_token: null};
    for (var k in p) o[k] = p[k];
    ["prefill", "decode"].forEach(function (ph) {
      var x = TF.roofline(c, hw, ph, s.batch, s.context, o);
      ["compute_s", "memory_s", "comm_s", "scale_up_s", "scale_out_s", "step_s", "tokens_per_s",
       "flops", "memory_bytes", "bound"].forEach(function (key) { r[ph + "_" + key] = x[key]; });
      r[ph + "_intensity"] = x.flops / x.memory_bytes;
      r[ph + "_binding"] = x.bound === "comm" ? x.link : x.bound;
    });
    r.ridge = hw.peak_flops[p.dtype] / hw.memory_bandwidth;     // ridge_point
    return r;
  };

  // ---- numbers as the page prints them: 3 significant digits with an SI prefix (tokenflow.viz.
  // model_page.fmt_si is the Python twin the tests compare with).
  var PREFIX = [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
  TF.fmtSI = function (x, unit) {
    unit = unit || "";
    if (x === 0) return "0 " + unit;
    var ax = Math.abs(x);
    for (var i = 0; i < PREFIX.length; i++) {
      if (ax >= PREFIX[i][0] * 0.9995)
        return sig3(x / PREFIX[i][0]) + " " + PREFIX[i][1] + unit;
    }
    return sig3(x) + " " + unit;
  };
  var BINARY = [[Math.pow(2, 50), "PiB"], [Math.pow(2, 40), "TiB"], [Math.pow(2, 30), "GiB"],
                [Math.pow(2, 20), "MiB"], [1024, "KiB"]];
  // bytes in binary units, as the rest of the book (fmt_bytes)
  TF.fmtBytes = function (x) {
    if (x === 0) return "0 B";
    var ax = Math.abs(x);
    for (var i = 0; i < BINARY.length; i++) {
      if (ax >= BINARY[i][0] * 0.9995) return sig3(x / BINARY[i][0]) + " " + BINARY[i][1];
    }
    return sig3(x) + " B";
  };
  function sig3(v) {
    var a = Math.abs(v), d = a >= 99.95 ? 0 : a >= 9.995 ? 1 : a >= 0.9995 ? 2 : 3;
    return v.toFixed(d);
  }
  TF.fmtTime = function (s) {
    if (s === 0) return "0 s";
    if (s >= 0.9995) return sig3(s) + " s";
    if (s >= 0.0009995) return sig3(s * 1e3) + " ms";
    return sig3(s * 1e6) + " \u00b5s";
  };
  TF.fmtInt = function (n) {
    return String(Math.round(n)).replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  };

  if (typeof module !== "undefined" && module.exports) module.exports = TF;
  else root.TokenflowModelCalc = TF;
})(this);
