#!/usr/bin/env bash
# Time to first token with the KV cache reloaded from Kylix vs recomputed
# (issue 21, docs/design/kv.md). Run ON the GPU machine from the repository
# root, as root (drop_caches), after `make gpu-build` (static binaries in
# .gpu/); needs python3 with torch (CUDA) and transformers. With the device
# tool:
#   run(command="bash scripts/gpu-kv-ttft.sh", carry=[".gpu"])
#
# A Llama of about 1.2 B parameters (Llama 3.2 1B's shape: 16 layers,
# hidden 2048, 32 heads, 8 KV heads, random bf16 weights; nothing is
# downloaded) gets a prompt of TOKENS (default 16384) random tokens. Times,
# medians of REPS (default 3), the first token's logits each way:
#   recompute  the whole prompt through the model (prefill);
#   pinned     the prefix's KV (every token but the last) copied from a
#              pinned host tensor by torch, then the last token: the limit
#              a host tier can reach;
#   memory     the prefix's KV got from the node's host tier (kylix.kv, 2 MiB
#              blocks into one CUDA allocation), then the last token;
#   disk       the same after the node was restarted and the page cache
#              dropped: every block from the disk tier, verified;
#   member     two members of a cluster on loopback (TLS data plane): the
#              blocks put on A, then got on B after B dropped its own
#              copies (kylix.kv clear), so every block comes from A.
# Every reload's logits must match the recompute's (same top token, cosine
# above 0.99). Prints the ratios; ends with "KV TTFT PASSED" or "KV TTFT
# FAILED".
set -uo pipefail
out=${OUT:-/tmp/kylix-kv-out}; mkdir -p "$out"
k=$PWD/.gpu/kylix
die() { echo "FAILED: $*"; echo; echo "KV TTFT FAILED"; exit 1; }
[ -x "$k" ] || die "$k missing: run 'make gpu-build' first and carry .gpu"
python3 -c 'import torch, transformers; assert torch.cuda.is_available(), "torch sees no GPU"' || die "python3 with torch (CUDA) and transformers is needed"
nvidia-smi -L 2>/dev/null

work=$(mktemp -d /var/tmp/kylix-ttft.XXXX)
export KYLIX_DATA=$work/data MNT=$work/mnt SOCK=$work/client.sock KYLIX=$k SERVE_LOG=$out/ttft-serve.log
export CLUSTER=$work/cluster
cleanup() {
  pkill -TERM -f "$k serve .*--mount $work/" 2>/dev/null
  for _ in $(seq 1 100); do pgrep -f "$k serve .*--mount $work/" >/dev/null || break; sleep 0.1; done
  pkill -9 -f "$k serve .*--mount $work/" 2>/dev/null
  umount -l "$MNT" "$CLUSTER/a/mnt" "$CLUSTER/b/mnt" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$MNT" "$CLUSTER"
$k cluster-key > "$CLUSTER/key" && chmod 600 "$CLUSTER/key" || die "cluster-key"

PYTHONPATH=$PWD/contrib/python TOKENS=${TOKENS:-16384} REPS=${REPS:-3} python3 - <<'PY' || die "the client failed"
import os, statistics, subprocess, time
import torch, transformers
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM
from kylix.kv import KVStore, key

T, reps = int(os.environ["TOKENS"]), int(os.environ["REPS"])
mnt, sock = os.environ["MNT"], os.environ["SOCK"]
node = None

def start():
    global node
    if os.path.exists(sock):
        os.unlink(sock)
    log = open(os.environ["SERVE_LOG"], "a")
    node = subprocess.Popen([os.environ["KYLIX"], "serve", "--mount", mnt, "--client-socket", sock,
                             "--log-level", "debug", "--kv-block", "2MiB", "--kv-mem", "4GiB", "--kv-disk", "8GiB"],
                            stdout=log, stderr=log, start_new_session=True)
    for _ in range(300):
        if os.path.exists(sock) and os.path.ismount(mnt):
            return KVStore(mnt)
        time.sleep(0.1)
    raise SystemExit("the node did not come up")

def stop():  # SIGTERM: the node writes what is queued for the disk tier first
    node.terminate(); node.wait(timeout=60)
    for _ in range(100):
        if not os.path.ismount(mnt):
            return
        time.sleep(0.1)

dev = torch.device("cuda:0")
print("torch", torch.__version__, "transformers", transformers.__version__, torch.cuda.get_device_name(0))
cfg = LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                  num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=T + 16,
                  tie_word_embeddings=True, rope_theta=500000.0)
torch.manual_seed(0)
with torch.device(dev):
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
params = sum(p.numel() for p in model.parameters())
print(f"model: {params / 1e9:.2f} B parameters (random), prompt {T} tokens")
ids = torch.randint(0, cfg.vocab_size, (1, T), device=dev)
L, H, D = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads

def layer_kv(cache, l):
    if hasattr(cache, "layers"):
        return cache.layers[l].keys, cache.layers[l].values
    return cache.key_cache[l], cache.value_cache[l]

def timed(f):
    torch.cuda.synchronize(); t0 = time.perf_counter(); r = f(); torch.cuda.synchronize()
    return time.perf_counter() - t0, r

with torch.inference_mode():
    # The prefix's KV, as a serving engine would keep it: one allocation
    # [L, 2, 1, H, T-1, D], cut into 2 MiB blocks (the last one padded).
    out = model(ids[:, :-1], use_cache=True)
    nbytes = L * 2 * H * (T - 1) * D * 2
    bs = 2 << 20
    nblocks = -(-nbytes // bs)
    flat = torch.zeros(nblocks * bs, dtype=torch.uint8, device=dev)
    kvt = flat[:nbytes].view(torch.bfloat16).view(L, 2, 1, H, T - 1, D)
    for l in range(L):
        k_, v_ = layer_kv(out.past_key_values, l)
        kvt[l, 0].copy_(k_); kvt[l, 1].copy_(v_)
    del out
    keys = [key("ttft", T, i) for i in range(nblocks)]
    print(f"prefix KV: {nbytes / 2**20:.0f} MiB in {nblocks} blocks of 2 MiB")

    def last_token(kv_flat):
        kv_ = kv_flat[:nbytes].view(torch.bfloat16).view(L, 2, 1, H, T - 1, D)
        cache = DynamicCache()
        for l in range(L):
            cache.update(kv_[l, 0], kv_[l, 1], l)
        return model(ids[:, -1:], past_key_values=cache, use_cache=True).logits[0, -1].float()

    def recompute():
        return model(ids, use_cache=True).logits[0, -1].float()

    recompute()  # warm-up: kernels, allocator
    ref = None
    res = {}
    def check(name, logits):
        c = torch.nn.functional.cosine_similarity(logits, ref, dim=0).item()
        same = int(logits.argmax()) == int(ref.argmax())
        assert same and c > 0.99, f"{name}: first token {int(logits.argmax())} vs {int(ref.argmax())}, cosine {c:.4f}"
    ts = []
    for _ in range(reps):
        dt, ref = timed(recompute); ts.append(dt)
    res["recompute"] = statistics.median(ts)

    dst = torch.empty_like(flat)
    pinned = flat.cpu().pin_memory()
    ts = []
    for _ in range(reps):
        dst.zero_()
        dt, lg = timed(lambda: (dst.copy_(pinned, non_blocking=True), last_token(dst))[1]); ts.append(dt)
        check("pinned", lg)
    res["pinned"] = statistics.median(ts)

    kv = start()
    ok = kv.put(keys, [flat[i * bs:(i + 1) * bs] for i in range(nblocks)])
    assert all(ok), f"{ok.count(False)} puts refused"
    def from_kylix():
        hits = kv.get(keys, out=[dst[i * bs:(i + 1) * bs] for i in range(nblocks)])
        assert all(hits), f"{hits.count(False)} misses"
        return last_token(dst)
    ts = []
    for _ in range(reps):
        dst.zero_()
        dt, lg = timed(from_kylix); ts.append(dt)
        check("memory", lg)
    res["memory"] = statistics.median(ts)
    tiers = kv.contains(keys); print("after the memory runs:", {t: tiers.count(t) for t in set(tiers)})

    ts = []
    for _ in range(reps):
        stop()
        subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], check=True)
        kv = start()
        assert kv.get([key("ttft-absent")], out=[dst[:bs]]) == [False]  # page-locks the host tier
        tiers = kv.contains(keys)
        assert tiers.count("disk") == nblocks, {t: tiers.count(t) for t in set(tiers)}
        dst.zero_()
        dt, lg = timed(from_kylix); ts.append(dt)
        check("disk", lg)
    res["disk"] = statistics.median(ts)
    stop()

    # Two members on loopback: put on A, get on B after B dropped its
    # own copies (the blocks whose home is B), so every get is a member's.
    cl = os.environ["CLUSTER"]
    members = {}
    def start_member(name, ip, join=None):
        d = f"{cl}/{name}"
        os.makedirs(f"{d}/mnt", exist_ok=True)
        log = open(f"{os.environ['SERVE_LOG']}.{name}", "a")
        args = [os.environ["KYLIX"], "serve", "--data", f"{d}/data", "--mount", f"{d}/mnt", "--client-socket", f"{d}/client.sock",
                "--listen", f"{ip}:7946", "--node-name", name, "--cluster-key", f"{cl}/key", "--replicas", "1",
                "--kv-block", "2MiB", "--kv-mem", "4GiB", "--kv-disk", "8GiB"] + (["--join", join] if join else [])
        members[name] = subprocess.Popen(args, stdout=log, stderr=log, start_new_session=True)
        for _ in range(300):
            if os.path.exists(f"{d}/client.sock") and os.path.ismount(f"{d}/mnt"):
                return KVStore(f"{d}/mnt")
            time.sleep(0.1)
        raise SystemExit(f"member {name} did not come up")
    kva = start_member("a", "127.0.0.2")
    kvb = start_member("b", "127.0.0.3", "127.0.0.2:7946")
    for _ in range(600):  # the membership forms: B sees A's blocks
        ok = kva.put(keys, [flat[i * bs:(i + 1) * bs] for i in range(nblocks)])
        kvb.clear()
        tiers = kvb.contains(keys)
        if all(ok) and tiers.count("member") == nblocks:
            break
        time.sleep(0.1)
    assert tiers.count("member") == nblocks, {t: tiers.count(t) for t in set(tiers)}
    def from_member():
        hits = kvb.get(keys, out=[dst[i * bs:(i + 1) * bs] for i in range(nblocks)])
        assert all(hits), f"{hits.count(False)} misses"
        return last_token(dst)
    ts = []
    for _ in range(reps):
        kvb.clear()
        dst.zero_()
        dt, lg = timed(from_member); ts.append(dt)
        check("member", lg)
    res["member"] = statistics.median(ts)
    for p in members.values():
        p.terminate(); p.wait(timeout=60)

print(f"time to first token, {T}-token prompt, medians of {reps}:")
for name, t in res.items():
    extra = "" if name == "recompute" else f"  ({res['recompute'] / t:.1f}x faster than recompute)"
    print(f"  {name:10s} {t * 1e3:8.1f} ms{extra}")
PY
echo; echo "KV TTFT PASSED"
