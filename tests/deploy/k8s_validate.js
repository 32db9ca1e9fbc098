#!/usr/bin/env node
// Offline checks of Kubernetes manifests (deploy/k8s), for CI without a cluster:
//
//   node tests/deploy/k8s_validate.js [--repo DIR] [--allow-missing FILE]... [--expect-error RE]
//        PATH...
//
// PATH is a manifest or a directory (its *.yaml files). Every YAML document is
//  1. validated against the OpenAPI schema of its apiVersion + kind (npm kubernetes-models; an
//     apiVersion or kind it does not know is an error, not a skip), and
//  2. checked for what the schemas leave optional but this project requires: images, probes,
//     resources, the security context, a termination grace longer than attend's
//     --shutdown_grace, selectors that match the pods they are meant for, references between
//     documents. A Kustomization must list every other manifest in its directory, and each file it
//     lists must exist (except those named with --allow-missing: files others maintain).
// Exit 0 when every document passes. With --expect-error RE the sense is inverted, for tests that
// feed broken manifests: exit 0 only when some error matches RE.
'use strict';

const fs = require('fs');
const path = require('path');
const YAML = require('yaml');

function usage(message) {
  process.stderr.write(`k8s_validate: ${message}\n`);
  process.exit(2);
}

function parseArgs(argv) {
  const opts = {repo: path.resolve(__dirname, '..', '..'), allowMissing: [], expectError: null,
                paths: []};
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const value = () => (i + 1 < argv.length ? argv[++i] : usage(`${a} needs a value`));
    if (a === '--repo') opts.repo = path.resolve(value());
    else if (a === '--allow-missing') opts.allowMissing.push(value());
    else if (a === '--expect-error') opts.expectError = new RegExp(value());
    else if (a.startsWith('--')) usage(`unknown option ${a}`);
    else opts.paths.push(a);
  }
  if (opts.paths.length === 0) usage('no manifest or directory given');
  return opts;
}

// What the image promises (../../Dockerfile): the uid of its user and the ports it exposes.
function readDockerfile(repo) {
  const text = fs.readFileSync(path.join(repo, 'Dockerfile'), 'utf8');
  const uid = /useradd\s[^\n]*--uid\s+(\d+)/.exec(text);
  const expose = /^EXPOSE\s+(.+)$/m.exec(text);
  if (!uid || !expose) throw new Error('Dockerfile: no `useradd --uid` or EXPOSE line');
  return {uid: Number(uid[1]), ports: expose[1].trim().split(/\s+/).map((p) => Number(p.split('/')[0]))};
}

// attend-server's default of a duration flag (shutdown_grace, snapshot_grace), from
// server/main.cc's ABSL_FLAG.
function defaultDurationFlag(repo, name) {
  const text = fs.readFileSync(path.join(repo, 'server', 'main.cc'), 'utf8');
  const m = new RegExp(`ABSL_FLAG\\(\\s*absl::Duration\\s*,\\s*${name}\\s*,\\s*absl::(Seconds|Milliseconds|Minutes)\\((\\d+)\\)`).exec(text);
  if (!m) throw new Error(`server/main.cc: no ${name} flag with a literal default`);
  return Number(m[2]) * {Seconds: 1, Milliseconds: 0.001, Minutes: 60}[m[1]];
}

function defaultShutdownGrace(repo) {
  return defaultDurationFlag(repo, 'shutdown_grace');
}

// A flag's value in a container: its --flag=value argument, else its ATTEND_<FLAG> variable,
// else undefined.
function flagValue(c, name) {
  let value;
  const env = (c.env || []).find((e) => e.name === `ATTEND_${name.toUpperCase()}`);
  if (env && env.value !== undefined) value = env.value;
  for (const a of [...(c.command || []).slice(1), ...(c.args || [])]) {
    const m = new RegExp(`^--?${name}=(.*)$`).exec(a);
    if (m) value = m[1];
  }
  return value;
}

// An absl::Duration flag value ("10s", "1m30s", "500ms", "1.5s") in seconds.
function parseDuration(text) {
  const re = /(\d+(?:\.\d+)?)(ms|us|ns|h|m|s)/g;
  let total = 0;
  let consumed = 0;
  let m;
  while ((m = re.exec(text)) !== null) {
    total += Number(m[1]) * {h: 3600, m: 60, s: 1, ms: 1e-3, us: 1e-6, ns: 1e-9}[m[2]];
    consumed += m[0].length;
  }
  return consumed === text.length && text.length > 0 ? total : NaN;
}

// The kubernetes-models class for apiVersion + kind, or null when the package has none.
function modelClass(apiVersion, kind) {
  if (typeof apiVersion !== 'string' || typeof kind !== 'string' || !/^[a-z0-9.\/]+$/.test(apiVersion)) {
    return null;
  }
  let module;
  try {
    module = require(`kubernetes-models/${apiVersion}`);
  } catch (e) {
    return null;
  }
  const cls = module[kind];
  return typeof cls === 'function' && cls.kind === kind && cls.apiVersion === apiVersion ? cls : null;
}

function labelsMatch(selector, labels) {
  // A LabelSelector (matchLabels / matchExpressions) or a Service's plain map against pod labels.
  if (!selector || typeof selector !== 'object') return false;
  labels = labels || {};
  const isLabelSelector = 'matchLabels' in selector || 'matchExpressions' in selector;
  const matchLabels = isLabelSelector ? selector.matchLabels || {} : selector;
  for (const [k, v] of Object.entries(matchLabels)) if (labels[k] !== v) return false;
  for (const e of (isLabelSelector && selector.matchExpressions) || []) {
    const has = Object.prototype.hasOwnProperty.call(labels, e.key);
    const inValues = (e.values || []).includes(labels[e.key]);
    if (e.operator === 'In' && !(has && inValues)) return false;
    if (e.operator === 'NotIn' && has && inValues) return false;
    if (e.operator === 'Exists' && !has) return false;
    if (e.operator === 'DoesNotExist' && has) return false;
  }
  return Object.keys(matchLabels).length > 0 || ((isLabelSelector && selector.matchExpressions) || []).length > 0;
}

const WORKLOADS = new Set(['Deployment', 'StatefulSet', 'DaemonSet', 'ReplicaSet']);

function isAttend(container) {
  return container.name === 'attend' || /(^|\/)attend(:|@|$)/.test(container.image || '');
}

function main() {
  const opts = parseArgs(process.argv.slice(2));
  const docker = readDockerfile(opts.repo);
  const errors = [];
  const docs = [];  // {file, index, doc}

  // Load every document of every file.
  const files = [];
  for (const p of opts.paths) {
    if (fs.statSync(p).isDirectory()) {
      for (const f of fs.readdirSync(p).sort()) {
        if (f.endsWith('.yaml') || f.endsWith('.yml')) files.push(path.join(p, f));
      }
    } else {
      files.push(p);
    }
  }
  if (files.length === 0) errors.push(`${opts.paths.join(' ')}: no manifests`);
  for (const file of files) {
    const parsed = YAML.parseAllDocuments(fs.readFileSync(file, 'utf8'));
    parsed.forEach((d, index) => {
      if (d.errors.length) {
        errors.push(`${file}#${index}: YAML: ${d.errors.map((e) => e.message).join('; ')}`);
        return;
      }
      const doc = d.toJS();
      if (doc === null || doc === undefined) return;  // an empty document (e.g. after a ---)
      docs.push({file, index, doc});
    });
  }

  const where = (d) => {
    const name = d.doc && d.doc.metadata && d.doc.metadata.name;
    return `${path.basename(d.file)}#${d.index} ${d.doc && d.doc.kind}${name ? '/' + name : ''}`;
  };
  const workloads = docs.filter((d) => WORKLOADS.has(d.doc.kind));
  const podLabels = (w) => (w.doc.spec && w.doc.spec.template && w.doc.spec.template.metadata &&
                            w.doc.spec.template.metadata.labels) || {};

  for (const d of docs) {
    const {doc} = d;
    const err = (message) => errors.push(`${where(d)}: ${message}`);
    if (typeof doc !== 'object' || Array.isArray(doc)) {
      err('not a mapping');
      continue;
    }

    if (doc.kind === 'Kustomization' && /^kustomize\.config\.k8s\.io\//.test(doc.apiVersion || '')) {
      checkKustomization(d, docs, opts, err);
      continue;
    }

    // 1. The schema.
    const cls = modelClass(doc.apiVersion, doc.kind);
    if (!cls) {
      err(`unknown apiVersion/kind ${doc.apiVersion} ${doc.kind} (no kubernetes-models class)`);
      continue;
    }
    try {
      new cls(doc).validate();
    } catch (e) {
      err(`schema: ${e.message}`);
      continue;
    }
    if (!doc.metadata || !doc.metadata.name) err('metadata.name missing');

    // 2. What the schema leaves optional.
    if (WORKLOADS.has(doc.kind)) checkWorkload(d, docs, docker, opts, err);
    if (doc.kind === 'Service' && doc.spec.selector) {
      const targets = workloads.filter((w) => labelsMatch(doc.spec.selector, podLabels(w)));
      if (targets.length === 0) {
        err(`selector ${JSON.stringify(doc.spec.selector)} matches the pods of no workload`);
      }
      for (const port of doc.spec.ports || []) {
        if (typeof port.targetPort !== 'string') continue;
        for (const w of targets) {
          const names = w.doc.spec.template.spec.containers.flatMap((c) => (c.ports || []).map((p) => p.name));
          if (!names.includes(port.targetPort)) err(`targetPort ${port.targetPort} is no named port of ${where(w)}`);
        }
      }
    }
    if (doc.kind === 'PodDisruptionBudget') {
      if (!workloads.some((w) => labelsMatch(doc.spec.selector, podLabels(w)))) {
        err(`selector ${JSON.stringify(doc.spec.selector)} matches the pods of no workload`);
      }
      if (doc.spec.minAvailable === undefined && doc.spec.maxUnavailable === undefined) {
        err('neither minAvailable nor maxUnavailable');
      }
    }
    if (doc.kind === 'HorizontalPodAutoscaler') {
      const ref = doc.spec.scaleTargetRef;
      const target = workloads.find((w) => w.doc.kind === ref.kind && w.doc.metadata.name === ref.name &&
                                           w.doc.apiVersion === ref.apiVersion);
      if (!target) err(`scaleTargetRef ${ref.apiVersion} ${ref.kind}/${ref.name} is not among the manifests`);
      if (!(doc.spec.metrics || []).length) err('no metrics');
    }
  }

  if (opts.expectError) {
    for (const e of errors) console.log(`rejected (as expected): ${e}`);
    if (errors.some((e) => opts.expectError.test(e))) {
      console.log(`OK: ${files.join(' ')} rejected with an error matching /${opts.expectError.source}/`);
      process.exit(0);
    }
    console.log(`FAIL: no error matched /${opts.expectError.source}/ - the broken manifest was accepted`);
    process.exit(1);
  }
  for (const d of docs) {
    if (!errors.some((e) => e.startsWith(where(d)))) console.log(`ok   ${where(d)} (${d.doc.apiVersion})`);
  }
  for (const e of errors) console.log(`FAIL ${e}`);
  console.log(`${docs.length} documents in ${files.length} files, ${errors.length} errors`);
  process.exit(errors.length ? 1 : 0);
}

function checkKustomization(d, docs, opts, err) {
  const dir = path.dirname(d.file);
  const resources = d.doc.resources;
  if (!Array.isArray(resources) || resources.some((r) => typeof r !== 'string')) {
    err('resources must be a list of file names');
    return;
  }
  for (const r of resources) {
    if (!fs.existsSync(path.join(dir, r))) {
      if (opts.allowMissing.includes(r)) console.log(`note ${path.basename(d.file)}: ${r} is listed but not here yet (allowed)`);
      else err(`resource ${r} does not exist`);
    }
  }
  for (const f of fs.readdirSync(dir)) {
    if (/\.ya?ml$/.test(f) && f !== path.basename(d.file) && !resources.includes(f)) {
      err(`${f} is in ${dir} but not in resources`);
    }
  }
}

function checkWorkload(d, docs, docker, opts, err) {
  const {doc} = d;
  const template = doc.spec.template;
  const pod = template.spec;
  if (!labelsMatch(doc.spec.selector, (template.metadata || {}).labels)) {
    err('spec.selector does not match the pod template labels');
  }
  if (doc.kind === 'StatefulSet') {
    const svc = docs.find((s) => s.doc.kind === 'Service' && s.doc.metadata && s.doc.metadata.name === doc.spec.serviceName);
    if (!svc) err(`serviceName ${doc.spec.serviceName} names no Service among the manifests`);
    else if (svc.doc.spec.clusterIP !== 'None') err(`Service ${doc.spec.serviceName} is not headless (clusterIP: None)`);
  }
  const podSec = pod.securityContext || {};
  for (const field of ['readOnlyRootFilesystem', 'allowPrivilegeEscalation', 'capabilities']) {
    if (field in podSec) err(`pod securityContext has container-only field ${field}`);
  }
  for (const c of [...(pod.initContainers || []), ...pod.containers]) {
    const cerr = (message) => err(`container ${c.name}: ${message}`);
    if (typeof c.image !== 'string' || c.image.trim() === '') cerr('no image');
    const sec = c.securityContext || {};
    const effective = (field) => (field in sec ? sec[field] : podSec[field]);
    if (effective('runAsNonRoot') !== true) cerr('securityContext.runAsNonRoot is not true');
    const uid = effective('runAsUser');
    if (!Number.isInteger(uid) || uid === 0) cerr('securityContext.runAsUser is not a non-zero uid');
    if (isAttend(c) && uid !== docker.uid) cerr(`runAsUser ${uid} is not the image's uid ${docker.uid} (Dockerfile)`);
    if (sec.readOnlyRootFilesystem !== true) cerr('securityContext.readOnlyRootFilesystem is not true');
    if (sec.allowPrivilegeEscalation !== false) cerr('securityContext.allowPrivilegeEscalation is not false');
    const drop = ((sec.capabilities || {}).drop || []);
    if (!drop.includes('ALL')) cerr('securityContext.capabilities.drop lacks ALL');
    if (((sec.capabilities || {}).add || []).length) cerr('securityContext.capabilities.add is not empty');
    const seccomp = effective('seccompProfile') || {};
    if (seccomp.type !== 'RuntimeDefault' && seccomp.type !== 'Localhost') {
      cerr('seccompProfile is not RuntimeDefault');
    }
    const res = c.resources || {};
    for (const [kind, key] of [['requests', 'cpu'], ['requests', 'memory'], ['limits', 'memory']]) {
      if (!res[kind] || res[kind][key] === undefined) cerr(`resources.${kind}.${key} is not set`);
    }
    if ((pod.initContainers || []).includes(c)) continue;
    for (const probe of ['livenessProbe', 'readinessProbe']) {
      if (!c[probe]) cerr(`no ${probe}`);
    }
    if (isAttend(c)) checkAttendContainer(c, pod, docker, opts, cerr, doc);
  }
}

function checkAttendContainer(c, pod, docker, opts, cerr, workload) {
  const ports = Object.fromEntries((c.ports || []).map((p) => [p.name, p.containerPort]));
  for (const [name, number] of Object.entries(ports)) {
    if (!docker.ports.includes(number)) cerr(`port ${name} ${number} is not EXPOSEd by the Dockerfile (${docker.ports})`);
  }
  if (ports.grpc === undefined) cerr('no container port named grpc');
  for (const [probe, service] of [['livenessProbe', ''], ['readinessProbe', 'attend.v1.KvCache']]) {
    const p = c[probe];
    if (!p) continue;
    if (!p.grpc) {
      cerr(`${probe} is not a gRPC probe`);
      continue;
    }
    if (p.grpc.port !== ports.grpc) cerr(`${probe} port ${p.grpc.port} is not the grpc port ${ports.grpc}`);
    if ((p.grpc.service || '') !== service) cerr(`${probe} checks service "${p.grpc.service || ''}", want "${service}"`);
  }
  // The server's drain must fit in the pod's termination grace: flag, else ATTEND_ env, else the
  // default in server/main.cc.
  let grace = defaultShutdownGrace(opts.repo);
  const env = (c.env || []).find((e) => e.name === 'ATTEND_SHUTDOWN_GRACE');
  if (env && env.value) grace = parseDuration(env.value);
  for (const a of [...(c.command || []).slice(1), ...(c.args || [])]) {
    const m = /^--?shutdown_grace=(.*)$/.exec(a);
    if (m) grace = parseDuration(m[1]);
  }
  if (Number.isNaN(grace)) cerr('--shutdown_grace is not a duration');
  const termination = pod.terminationGracePeriodSeconds;
  if (!Number.isInteger(termination)) cerr('terminationGracePeriodSeconds is not set');
  else if (!(termination > grace)) {
    cerr(`terminationGracePeriodSeconds ${termination} leaves no margin over --shutdown_grace ${grace}s`);
  }
  // With --snapshot_dir the save after the drain must fit in the grace too, and the directory
  // must be on a volume that outlives the pod, or the snapshots end with it.
  const snapshotDir = flagValue(c, 'snapshot_dir');
  if (snapshotDir) {
    const given = flagValue(c, 'snapshot_grace');
    const snapshotGrace = given !== undefined ? parseDuration(given) : defaultDurationFlag(opts.repo, 'snapshot_grace');
    if (Number.isNaN(snapshotGrace)) cerr('--snapshot_grace is not a duration');
    else if (Number.isInteger(termination) && !(termination > grace + snapshotGrace)) {
      cerr(`terminationGracePeriodSeconds ${termination} leaves no margin over --shutdown_grace ${grace}s ` +
           `+ --snapshot_grace ${snapshotGrace}s`);
    }
    const under = (m) => snapshotDir === m.mountPath || snapshotDir.startsWith(m.mountPath.replace(/\/$/, '') + '/');
    const mount = (c.volumeMounts || []).filter(under).sort((a, b) => b.mountPath.length - a.mountPath.length)[0];
    const claims = (((workload || {}).spec || {}).volumeClaimTemplates || []).map((t) => (t.metadata || {}).name);
    const volume = mount && (pod.volumes || []).find((v) => v.name === mount.name);
    const persistent = mount && (claims.includes(mount.name) || (volume && volume.persistentVolumeClaim));
    if (!persistent) {
      cerr(`--snapshot_dir ${snapshotDir} is not on a persistent volume (a volumeClaimTemplates or ` +
           'persistentVolumeClaim mount): the snapshots would end with the pod');
    } else if (mount.readOnly) {
      cerr(`--snapshot_dir ${snapshotDir} is on a read-only mount`);
    }
  }
  // The KV cache must fit in the memory limit with room to spare: flag, else ATTEND_ env (the
  // default, half of the limit, always fits but is not a sizing decision).
  let kv;
  const kvEnv = (c.env || []).find((e) => e.name === 'ATTEND_KV_CACHE_BYTES');
  if (kvEnv && kvEnv.value) kv = kvEnv.value;
  for (const a of [...(c.command || []).slice(1), ...(c.args || [])]) {
    const m = /^--?kv_cache_bytes=(.*)$/.exec(a);
    if (m) kv = m[1];
  }
  if (kv === undefined) cerr('no --kv_cache_bytes: the memory limit cannot be checked against it');
  else {
    const kvBytes = flagBytes(kv);
    const limit = quantityBytes(((c.resources || {}).limits || {}).memory);
    if (Number.isNaN(kvBytes)) cerr(`--kv_cache_bytes ${kv} is not a byte count`);
    else if (!(limit > kvBytes)) cerr(`memory limit ${limit} bytes is not above --kv_cache_bytes ${kvBytes}`);
  }
}

// A byte count as attend-server's flags take it ("2147483648", "2GiB", "1.5 GB", "1e9").
function flagBytes(text) {
  const m = /^(\d+(?:\.\d+)?(?:e\d+)?)\s?([kmgtp]i?b|b)?$/i.exec(String(text).trim());
  if (!m) return NaN;
  const unit = (m[2] || 'b').toLowerCase();
  const binary = {kib: 2 ** 10, mib: 2 ** 20, gib: 2 ** 30, tib: 2 ** 40, pib: 2 ** 50};
  const decimal = {b: 1, kb: 1e3, mb: 1e6, gb: 1e9, tb: 1e12, pb: 1e15};
  return Number(m[1]) * (binary[unit] || decimal[unit]);
}

// A memory quantity ("3Gi", "512M", "1e9") in bytes.
function quantityBytes(q) {
  if (q === undefined) return NaN;
  const m = /^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|e\d+)?$/.exec(String(q));
  if (!m) return NaN;
  const unit = m[2] || '';
  const scale = unit.startsWith('e') ? 10 ** Number(unit.slice(1))
    : {'': 1, Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, Pi: 2 ** 50, Ei: 2 ** 60,
       k: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15, E: 1e18}[unit];
  return Number(m[1]) * scale;
}

main();
