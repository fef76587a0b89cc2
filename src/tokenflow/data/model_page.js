// The model page's DOM: controls, the two lenses with each number at its stage, the formulas
// with their values and sources. The arithmetic is model_page_calc.js (TokenflowModelCalc).
// The page's text in English and Chinese; the edition is the document's lang.
(function () {
  "use strict";
  var TF = window.TokenflowModelCalc;
  var S = {
    en: {
      model: "model", hardware: "hardware", precision: "precision", batch: "batch (sequences)",
      context: "context (tokens)", tp: "TP", ep: "EP", pasted: "pasted config.json",
      paste: "Or paste a config.json (Hugging Face) and read it:", read: "Read this config",
      bf16: "BF16 everywhere", fp8: "FP8 weights and matmuls, BF16 attention and KV (DeepSeek's service)",
      pipeline: "Serving pipeline (pipeline lens)", block: "Model block lens: runs inside prefill " +
        "(every prompt token at once) and inside each decode step (one token per sequence)",
      queue: "request queue", prefill: "prefill", kvcache: "KV cache", decode: "decode loop",
      sampling: "sampling", response: "response", input: "input tokens", embedding: "embedding",
      attention: "attention + KV", ffn: "FFN / MoE", lmhead: "LM head", output: "output token",
      layers: "layers", perTok: "per token", logits: "vocab logits", routed: "routed of",
      shared: "shared", moeLayers: "MoE layers", denseLayers: "dense layers", dense: "dense FFN",
      heads: "query heads", kvHeads: "KV heads", window: "sliding window",
      slidingOf: "sliding layers of", params: "parameters", active: "active per token",
      latent: "latent rank kv_lora_rank",
      bound: "binding", perGpu: "per GPU", fits: "fits", noFit: "does not fit",
      formulas: "The formulas, computed live for this setting",
      quantity: "quantity", formula: "formula", value: "value", source: "source (Python, " +
        "the definition)", roof: "Roofline per GPU (one step, each unit at its peak)",
      phase: "phase", compute: "compute", memory: "memory", nvlink: "NVLink", ib: "InfiniBand",
      step: "step (decode: per output token)", tokS: "tokens/s per GPU", scale_up: "NVLink", scale_out: "InfiniBand",
      weightsTp: "weights split by TP", weightsEp: "routed experts split by EP",
      weightsRep: "replicated (norms, router)", weights: "weights per GPU", kv: "KV cache per GPU",
      used: "weights + KV per GPU", budget: "memory for them (0.9 of the GPU)",
      maxBatch: "sequences of this context that fit", kvTok: "KV bytes per token",
      unsupported: "Fields this config has that the cost model cannot express (shapes are " +
        "shown; counts refuse, as tokenflow's Python does):",
      error: "This config cannot be read: ", controlError: "This setting is not possible: ",
      hwSource: "hardware source", note: "A bound, not a prediction: real kernels reach a " +
        "fraction of peak. Tokens/s: new tokens of the step / max(compute, memory, comm).",
      kinds: {MHA: "MHA", GQA: "GQA", MQA: "MQA", MLA: "MLA (latent KV)",
              linear: "linear-attention layers (not modelled)"},
      paths: "decode: every pair off the GPU point to point over InfiniBand; prefill: " +
        "once over InfiniBand per node reached, then NVLink (DeepSeek-V3 report 3.4)",
      groups: "expert groups per token (group-limited routing)",
      intensity: "FLOPs per byte", ridgeName: "ridge point (peak FLOP/s / HBM bandwidth)",
      ctxShort: "context", seqs: "sequences", inPrefill: "prefill: the prompt",
      inDecode: "decode: the last token", outTok: "one per sequence per step",
      streamed: "tokens streamed back",
      fParams: "\u03a3 embedding, attention, FFN / experts, router, norms, LM head",
      fActive: "routed experts \u00d7 K / E",
      fWeightsTp: "(embedding + attention + dense FFN + shared + LM head) / TP (K/V heads whole)",
      fWeightsEp: "routed experts / EP", fWeightsRep: "(norms + router)",
      fWeights: "sum of the three",
      fKv: "batch \u00b7 \u03a3 layers min(context, window) \u00b7 bytes per layer / TP",
      fUsed: "weights + KV",
      fMaxBatch: "\u230a(0.9 \u00b7 memory \u2212 weights) / KV per sequence\u230b",
      fCompute: function (d, a) {
        return "compute = (FLOPs \u2212 attention FLOPs) / peak[" + d + "] + attention " +
          "FLOPs / peak[" + a + "]; memory = bytes (weights touched + KV read and written) " +
          "/ HBM bandwidth; NVLink, InfiniBand = all-to-all";
      },
      fDispatch: "dispatch", fCombine: "combine",
      fTail: " and TP all-reduce bytes / link bandwidth. ",
      hwSources: {}, modelNames: {}
    },
    zh: {
      model: "模型", hardware: "硬件", precision: "精度", batch: "批大小（序列数）",
      context: "上下文（词元）", tp: "TP", ep: "EP", pasted: "输入的 config.json",
      paste: "或者输入一个 config.json（Hugging Face 格式）并读取：", read: "读取这个配置",
      bf16: "全部 BF16", fp8: "FP8 权重和矩阵乘法，注意力和 KV 用 BF16（DeepSeek 的线上服务）",
      pipeline: "服务流水线（流水线视角）", block: "模型块视角：在预填充中运行（所有提示词词元一次算完），" +
        "也在每个解码步中运行（每个序列一个词元）",
      queue: "请求队列", prefill: "预填充", kvcache: "KV 缓存", decode: "解码循环",
      sampling: "采样", response: "响应", input: "输入词元", embedding: "嵌入",
      attention: "注意力 + KV", ffn: "FFN / MoE", lmhead: "LM 头", output: "输出词元",
      layers: "层", perTok: "每个词元", logits: "个词表 logits", routed: "个路由专家，共",
      shared: "个共享专家", moeLayers: "个 MoE 层", denseLayers: "个稠密层", dense: "稠密 FFN",
      heads: "个查询头", kvHeads: "个 KV 头", window: "滑动窗口",
      slidingOf: "个滑动窗口层，共", params: "参数", active: "每个词元激活",
      latent: "潜向量秩 kv_lora_rank",
      bound: "瓶颈", perGpu: "每块 GPU", fits: "放得下", noFit: "放不下",
      formulas: "公式：按当前设置实时计算",
      quantity: "量", formula: "公式", value: "值", source: "来源（Python，即定义）",
      roof: "每块 GPU 的屋顶线（一步，每个部件都按峰值算）",
      phase: "阶段", compute: "计算", memory: "显存", nvlink: "NVLink", ib: "InfiniBand",
      step: "一步（解码：每个输出词元）", tokS: "每块 GPU 每秒词元数", scale_up: "NVLink", scale_out: "InfiniBand",
      weightsTp: "按 TP 切分的权重", weightsEp: "按 EP 切分的路由专家",
      weightsRep: "复制的部分（归一化、路由器）", weights: "每块 GPU 的权重", kv: "每块 GPU 的 KV 缓存",
      used: "每块 GPU 的权重 + KV", budget: "可用显存（GPU 的 0.9）",
      maxBatch: "这个上下文下放得下的序列数", kvTok: "每个词元的 KV 字节数",
      unsupported: "这个配置里有成本模型无法表达的字段（形状照常显示；不给出计数，和 tokenflow " +
        "的 Python 一样）：",
      error: "无法读取这个配置：", controlError: "这个设置不可行：",
      hwSource: "硬件数据来源", note: "这是上界，不是预测：真实内核只能达到峰值的一部分。" +
        "每秒词元数 = 这一步的新词元数 / max(计算, 显存, 通信)。",
      kinds: {MHA: "MHA", GQA: "GQA", MQA: "MQA", MLA: "MLA（潜在 KV）",
              linear: "线性注意力层（未建模）"},
      paths: "解码：每个不在本 GPU 上的 (词元, 专家) 对经 InfiniBand 点对点发送；预填充：" +
        "每到一个节点经 InfiniBand 发一次，再走 NVLink（DeepSeek-V3 报告 3.4 节）",
      groups: "个专家组（分组限制路由）",
      intensity: "每字节 FLOPs", ridgeName: "脊点（峰值 FLOP/s / HBM 带宽）",
      ctxShort: "上下文", seqs: "个序列", inPrefill: "预填充：整个提示词",
      inDecode: "解码：上一个词元", outTok: "每步每个序列一个", streamed: "词元流式返回",
      fParams: "\u03a3 嵌入、注意力、FFN / 专家、路由器、归一化、LM 头",
      fActive: "路由专家 \u00d7 K / E",
      fWeightsTp: "(嵌入 + 注意力 + 稠密 FFN + 共享专家 + LM 头) / TP（K/V 头不切分）",
      fWeightsEp: "路由专家 / EP", fWeightsRep: "(归一化 + 路由器)",
      fWeights: "三者之和",
      fKv: "批大小 \u00b7 \u03a3 各层 min(上下文, 窗口) \u00b7 每层字节数 / TP",
      fUsed: "权重 + KV",
      fMaxBatch: "\u230a(0.9 \u00b7 显存 \u2212 权重) / 每个序列的 KV\u230b",
      fCompute: function (d, a) {
        return "计算 = (FLOPs \u2212 注意力 FLOPs) / 峰值[" + d + "] + 注意力 FLOPs / " +
          "峰值[" + a + "]；显存 = 字节数（读到的权重 + 读写的 KV）/ HBM 带宽；NVLink、" +
          "InfiniBand = all-to-all";
      },
      fDispatch: "分发", fCombine: "合并",
      fTail: "，以及 TP all-reduce 字节数 / 链路带宽。",
      modelNames: {"tokenflow tiny (the book's model)": "tokenflow tiny（本书的小模型）"},
      hwSources: {
        "H100 SXM": "NVIDIA H100 Tensor Core GPU 数据手册 SXM 栏：BF16/FP16 Tensor Core " +
          "1,979 TFLOPS 和 FP8 3,958 TFLOPS 是“含稀疏”的值，这里减半为稠密值（989 / 1,979）；" +
          "FP32（不用 Tensor Core）67 TFLOPS。HBM3 80 GB，3.35 TB/s；NVLink 4 的 900 GB/s 是" +
          "双向合计（每个方向 450 GB/s）；节点间：DGX H100 数据手册，每块 GPU 一块 ConnectX-7 " +
          "400 Gb/s（50 GB/s）。本次没有重读原文：按记忆中的数据手册，并与一个二手页面" +
          "（glennklockwood.com/garden/processors/h100）核对。",
        "H200 SXM": "算力同 H100（NVIDIA H100 数据手册 SXM 栏，含稀疏的值减半为稠密值；" +
          "按 NVIDIA H200 数据手册是同一颗 GH100）；HBM3e 141 GB，4.8 TB/s；NVLink 900 GB/s " +
          "为双向合计；节点间同 H100（每块 GPU 400 Gb/s）。按记忆中的数据手册，并与二手页面" +
          "核对；本次未对照原始资料核实（UNVERIFIED）。",
        "H800 SXM": "算力和 HBM 同 H100 SXM（NVLink 削减的出口版本；本次未对照 NVIDIA 数据手册" +
          "核实，UNVERIFIED）。链路：DeepSeek-V3 报告 arXiv:2412.19437 第 3.2.2 节，关于 " +
          "DeepSeek 的 H800 集群：“NVLink 提供 160 GB/s 的带宽，约为 IB（50 GB/s）的 3.2 倍”" +
          "（已对照报告 arXiv v2 的 HTML 原文）。"
      }
    }
  };

  function el(tag, attrs, kids) {
    var e = document.createElement(tag);
    for (var k in (attrs || {})) {
      if (k === "text") e.textContent = attrs[k];
      else if (k === "cls") e.className = attrs[k];
      else e.setAttribute(k, attrs[k]);
    }
    (kids || []).forEach(function (c) { if (c) e.appendChild(c); });
    return e;
  }
  function num(key, text) { return el("span", {cls: "tf-mp-num", "data-k": key, text: text}); }

  function attentionKind(c, L) {
    var linear = c.unsupported_fields.some(function (f) { return f.indexOf("linear_") === 0; });
    return baseKind(c, L) + (linear ? " + " + L.kinds.linear : "");
  }
  function baseKind(c, L) {
    if (c.kv_lora_rank !== null) return L.kinds.MLA;
    if (c.num_key_value_heads === c.num_attention_heads) return L.kinds.MHA;
    if (c.num_key_value_heads === 1) return L.kinds.MQA;
    return L.kinds.GQA;
  }

  function mount(root) {
    var data = JSON.parse(root.querySelector(".tf-mp-data").textContent);
    var L = (document.documentElement.lang || "en").toLowerCase().indexOf("zh") === 0 ?
        S.zh : S.en;
    TF.T = data.tables;
    var still = root.querySelector(".tf-mp-static");
    if (still) still.style.display = "none";          // the live page replaces it
    var d0 = data["default"], names = Object.keys(data.models);
    var state = {pasted: null};

    function select(id, opts, val) {
      var s = el("select", {"data-ctl": id});
      opts.forEach(function (o) {
        var op = el("option", {value: String(o[0]), text: o[1]});
        if (String(o[0]) === String(val)) op.selected = true;
        s.appendChild(op);
      });
      return s;
    }
    function field(label, input) {
      return el("label", {cls: "tf-mp-ctl"}, [el("span", {text: label}), input]);
    }
    var ctl = {
      model: select("model", names.map(function (n) { return [n, L.modelNames[n] || n]; }), d0.model),
      hardware: select("hardware", Object.keys(data.hardware).sort().map(function (h) {
        return [h, data.hardware[h].name]; }), d0.hardware),
      precision: select("precision", [["bf16", L.bf16], ["fp8", L.fp8]], d0.precision),
      batch: el("input", {type: "number", min: "1", step: "1", value: String(d0.batch),
                          "data-ctl": "batch"}),
      context: el("input", {type: "number", min: "1", step: "1", value: String(d0.context),
                            "data-ctl": "context"}),
      tp: select("tp", [1, 2, 4, 8, 16].map(function (v) { return [v, String(v)]; }), d0.tp),
      ep: select("ep", [1, 2, 4, 8, 16, 32, 64, 128, 256].map(function (v) {
        return [v, String(v)]; }), d0.ep)
    };
    var paste = el("textarea", {rows: "4", "data-ctl": "paste", spellcheck: "false",
                                placeholder: '{"model_type": "llama", "hidden_size": 4096, ...}'});
    var readBtn = el("button", {type: "button", "data-ctl": "read", text: L.read});
    var controls = el("div", {cls: "tf-mp-controls"}, [
      field(L.model, ctl.model), field(L.hardware, ctl.hardware),
      field(L.precision, ctl.precision), field(L.batch, ctl.batch),
      field(L.context, ctl.context), field(L.tp, ctl.tp), field(L.ep, ctl.ep)]);
    var pasteBox = el("div", {cls: "tf-mp-paste"}, [el("div", {text: L.paste}), paste, readBtn]);
    var msg = el("div", {cls: "tf-mp-msg", role: "status"});
    var figure = el("div", {cls: "tf-mp-figure"});
    var tables = el("div", {cls: "tf-mp-tables"});
    root.appendChild(controls); root.appendChild(pasteBox); root.appendChild(msg);
    root.appendChild(figure); root.appendChild(tables);

    function stage(cls, title, lines) {
      return el("div", {cls: "tf-mp-stage " + cls}, [el("div", {cls: "tf-mp-title", text: title})]
                .concat(lines.map(function (l) { return el("div", {cls: "tf-mp-line"}, l); })));
    }
    function arrow(label) {
      return el("div", {cls: "tf-mp-arrow"}, [el("span", {text: "\u2192"})].concat(
        label ? [el("span", {cls: "tf-mp-flow", text: label})] : []));
    }
    function t(s) { return document.createTextNode(s); }

    function drawFigure(c, r, s) {
      figure.innerHTML = "";
      var H = "H = " + TF.fmtInt(c.hidden_size);
      var moeL = TF.numMoeLayers(c), slid = TF.numSlidingLayers(c);
      var kvTok = r ? [num("kv_bytes_per_token", TF.fmtBytes(r.kv_bytes_per_token)),
                       t(" " + L.perTok)] : [];
      var attLines = [[t(attentionKind(c, L) + ", " + c.num_attention_heads + " " + L.heads +
                         (c.kv_lora_rank === null ? ", " + c.num_key_value_heads + " " +
                          L.kvHeads : ", " + L.latent + " " + c.kv_lora_rank))], kvTok];
      if (slid) attLines.push([t(L.window + " " + TF.fmtInt(c.sliding_window) + ": " + slid +
                                 " " + L.slidingOf + " " + c.num_hidden_layers)]);
      var ffnLines = c.num_experts ? [
        [num("experts_per_token", c.num_experts_per_tok + " " + L.routed + " " + c.num_experts +
             (c.num_shared_experts ? " + " + c.num_shared_experts + " " + L.shared : ""))],
        [t(moeL + " " + L.moeLayers + ", " + (c.num_hidden_layers - moeL) + " " +
           L.denseLayers)]] : [[t(L.dense + ", I = " + TF.fmtInt(c.intermediate_size))]];
      var block = el("div", {cls: "tf-mp-block"}, [
        el("div", {cls: "tf-mp-caption", text: L.block}),
        el("div", {cls: "tf-mp-row"}, [
          stage("b-in", L.input, [[t(L.inPrefill)], [t(L.inDecode)]]), arrow(""),
          stage("b-emb", L.embedding, [[t("V \u00d7 H = " + TF.fmtInt(c.vocab_size) + " \u00d7 " +
                                          TF.fmtInt(c.hidden_size))]]), arrow(H),
          el("div", {cls: "tf-mp-layers"}, [
            el("div", {cls: "tf-mp-title", text: "\u00d7 " + c.num_hidden_layers + " " +
                       L.layers}),
            el("div", {cls: "tf-mp-row"}, [stage("b-att", L.attention, attLines), arrow(H),
                                           stage("b-ffn", L.ffn, ffnLines)])]),
          arrow(H),
          stage("b-head", L.lmhead, [[num("vocab_logits", TF.fmtInt(c.vocab_size)),
                                      t(" " + L.logits)]]), arrow(""),
          stage("b-out", L.output, [[t(L.outTok)]])])]);
      var pre = r ? [[num("prefill_tokens_per_s_fig", TF.fmtSI(r.prefill_tokens_per_s, "tok/s"))],
                     [t(L.bound + ": " + L[r.prefill_binding])]] : [];
      var dec = r ? [[num("decode_tokens_per_s_fig", TF.fmtSI(r.decode_tokens_per_s, "tok/s"))],
                     [t(L.bound + ": " + L[r.decode_binding])]] : [];
      var kv = r ? [[num("kv_cache_fig", TF.fmtBytes(r.kv_cache)), t(" " + L.perGpu)],
                    [t(s.batch + " \u00d7 " + TF.fmtInt(s.context) + " " + L.ctxShort)]] : [];
      var params = r ? el("div", {cls: "tf-mp-params"}, [
        num("params_total", TF.fmtSI(r.params_total, "")), t(" " + L.params + ", "),
        num("params_active", TF.fmtSI(r.params_active, "")), t(" " + L.active)]) : null;
      figure.appendChild(el("div", {cls: "tf-mp-pipeline"}, [
        el("div", {cls: "tf-mp-caption", text: L.pipeline}), params,
        el("div", {cls: "tf-mp-row"}, [
          stage("p-queue", L.queue, [[t(s.batch + " " + L.seqs)]]),
          arrow(""), stage("p-prefill", L.prefill, pre), arrow(""),
          stage("p-kv", L.kvcache, kv), arrow(""), stage("p-decode", L.decode, dec), arrow(""),
          stage("p-sampling", L.sampling, [[t(TF.fmtInt(c.vocab_size) + " " + L.logits)]]),
          arrow(""), stage("p-response", L.response, [[t(L.streamed)]])]),
        block]));
    }

    function row(cells, head) {
      return el("tr", {}, cells.map(function (x) {
        var td = el(head ? "th" : "td");
        if (typeof x === "string") td.textContent = x; else td.appendChild(x);
        return td;
      }));
    }
    function drawTables(c, r, s, hw) {
      tables.innerHTML = "";
      var p = TF.PRECISIONS[s.precision], b = p.bytes_per_param, kb = p.kv_bytes_per_element;
      var cm = "tokenflow.analysis.costmodel.", rf = "tokenflow.analysis.roofline.";
      var kvForm = c.kv_lora_rank !== null ?
          "L \u00b7 (kv_lora_rank + qk_rope_head_dim) \u00b7 " + kb + " B" :
          "2 \u00b7 L \u00b7 num_key_value_heads \u00b7 head_dim \u00b7 " + kb + " B";
      var rows = [
        [L.params, L.fParams,
         num("params_total_t", TF.fmtSI(r.params_total, "")), cm + "param_count"],
        [L.active, L.fActive + " (" + c.num_experts_per_tok + " / " +
         c.num_experts + ")", num("params_active_t", TF.fmtSI(r.params_active, "")),
         cm + "active_param_count"],
        [L.kvTok, kvForm, num("kv_bytes_per_token_t", TF.fmtBytes(r.kv_bytes_per_token)),
         cm + "kv_cache_bytes_per_token"],
        [L.weightsTp, L.fWeightsTp + " \u00b7 " + b + " B",
         num("weights_tp", TF.fmtBytes(r.weights_tp)),
         cm + "weight_bytes_per_device"],
        [L.weightsEp, L.fWeightsEp + " \u00b7 " + b + " B",
         num("weights_ep", TF.fmtBytes(r.weights_ep)), cm + "weight_bytes_per_device"],
        [L.weightsRep, L.fWeightsRep + " \u00b7 " + b + " B",
         num("weights_replicated", TF.fmtBytes(r.weights_replicated)),
         cm + "weight_bytes_per_device"],
        [L.weights, L.fWeights, num("weights", TF.fmtBytes(r.weights)),
         cm + "weight_bytes_per_device"],
        [L.kv, L.fKv,
         num("kv_cache", TF.fmtBytes(r.kv_cache)), cm + "kv_cache_bytes"],
        [L.used, L.fUsed, num("memory_used", TF.fmtBytes(r.memory_used)),
         (r.fits ? L.fits : L.noFit)],
        [L.budget, "0.9 \u00b7 " + TF.fmtBytes(hw.memory_bytes),
         num("memory_budget", TF.fmtBytes(r.memory_budget)), hw.name],
        [L.maxBatch, L.fMaxBatch,
         num("max_batch", TF.fmtInt(r.max_batch)), cm + "max_batch_size"]];
      var t1 = el("table", {cls: "tf-mp-table"}, [row([L.quantity, L.formula, L.value,
                                                        L.source], true)]);
      rows.forEach(function (x) { t1.appendChild(row(x)); });
      t1.querySelectorAll("tr")[9].setAttribute("data-fits", r.fits ? "yes" : "no");
      var t2 = el("table", {cls: "tf-mp-table"}, [row([L.phase, L.compute, L.memory, L.nvlink,
                                                        L.ib, L.step, L.tokS, L.bound,
                                                        L.intensity], true)]);
      ["prefill", "decode"].forEach(function (ph) {
        t2.appendChild(row([L[ph], num(ph + "_compute_s", TF.fmtTime(r[ph + "_compute_s"])),
                            num(ph + "_memory_s", TF.fmtTime(r[ph + "_memory_s"])),
                            num(ph + "_scale_up_s", TF.fmtTime(r[ph + "_scale_up_s"])),
                            num(ph + "_scale_out_s", TF.fmtTime(r[ph + "_scale_out_s"])),
                            num(ph + "_step_s", TF.fmtTime(r[ph + "_step_s"])),
                            num(ph + "_tokens_per_s", TF.fmtSI(r[ph + "_tokens_per_s"], "tok/s")),
                            num(ph + "_binding", L[r[ph + "_binding"]]),
                            num(ph + "_intensity", TF.fmtSI(r[ph + "_intensity"], ""))]));
      });
      t2.appendChild(row([L.ridgeName, "", "", "", "", "", "", "",
                          num("ridge", TF.fmtSI(r.ridge, ""))]));
      var forms = el("div", {cls: "tf-mp-forms"}, [
        el("div", {text: L.fCompute(p.dtype, p.attention_dtype) + " (" + L.fDispatch + " " +
                   p.dispatch_bytes_per_element + " B, " + L.fCombine + " " +
                   p.combine_bytes_per_element + " B; " + L.paths +
                   (c.n_group > 1 && c.topk_group < c.n_group ? "; " + c.topk_group + " / " +
                    c.n_group + " " + L.groups : "") + ")" + L.fTail +
                   rf + "roofline, " + rf + "forward_flops, " + cm + "forward_bytes"}),
        el("div", {cls: "tf-mp-note", text: L.note}),
        el("div", {cls: "tf-mp-note",
                   text: L.hwSource + ": " + (L.hwSources[hw.name] || hw.source)})]);
      tables.appendChild(el("div", {cls: "tf-mp-caption", text: L.formulas}));
      tables.appendChild(el("div", {cls: "tf-mp-scroll"}, [t1]));
      tables.appendChild(el("div", {cls: "tf-mp-caption", text: L.roof}));
      tables.appendChild(el("div", {cls: "tf-mp-scroll"}, [t2]));
      tables.appendChild(forms);
    }

    function settings() {
      return {model: ctl.model.value, hw: ctl.hardware.value, precision: ctl.precision.value,
              batch: Number(ctl.batch.value), context: Number(ctl.context.value),
              tp: Number(ctl.tp.value), ep: Number(ctl.ep.value)};
    }
    function say(cls, text, items) {
      msg.className = "tf-mp-msg " + cls;
      msg.innerHTML = "";
      if (text) msg.appendChild(el("div", {text: text}));
      if (items && items.length) msg.appendChild(el("ul", {}, items.map(function (x) {
        return el("li", {text: x}); })));
    }

    function update() {
      var s = settings(), hf = s.model === "__pasted__" ? state.pasted : data.models[s.model];
      var hw = data.hardware[s.hw], c, r = null;
      say("", "");
      try {
        c = TF.checkConfig(TF.parseHF(hf, data.tables));
      } catch (e) {
        figure.innerHTML = ""; tables.innerHTML = "";
        say("tf-mp-error", L.error + e.message);
        return;
      }
      if (c.unsupported_fields.length) {
        say("tf-mp-unsupported", L.unsupported, c.problems);
        drawFigure(c, null, s); tables.innerHTML = "";
        return;
      }
      try {
        r = TF.numbers(c, hw, s);
      } catch (e) {
        say("tf-mp-error", L.controlError + e.message);
        drawFigure(c, null, s); tables.innerHTML = "";
        return;
      }
      drawFigure(c, r, s); drawTables(c, r, s, hw);
    }

    readBtn.addEventListener("click", function () {
      var hf;
      try { hf = JSON.parse(paste.value); } catch (e) {
        say("tf-mp-error", L.error + "JSON: " + e.message);
        figure.innerHTML = ""; tables.innerHTML = "";
        return;
      }
      state.pasted = hf;
      if (!ctl.model.querySelector('option[value="__pasted__"]'))
        ctl.model.appendChild(el("option", {value: "__pasted__", text: L.pasted}));
      ctl.model.value = "__pasted__";
      update();
    });
    Object.keys(ctl).forEach(function (k) {
      ctl[k].addEventListener(ctl[k].tagName === "INPUT" ? "input" : "change", update);
    });
    update();
  }

  var s = document.currentScript, root = s && s.closest(".tf-model-page");
  if (root && !root.getAttribute("data-mounted")) {
    root.setAttribute("data-mounted", "1");
    mount(root);
  }
  window.TokenflowModelPage = {mount: mount};
})();
