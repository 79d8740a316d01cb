// kubernetes.test.mjs - deploy/kubernetes/ without a cluster: every object
// passes its schema (Kubernetes' and Gateway API's from the kubernetes-models
// packages, InferencePool's from its CRD, kept in tests/fixtures/kubernetes/),
// the objects refer to each other consistently, the endpoint picker's plugin
// configuration holds together, and vlmd's command line uses flags vlmd has.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import YAML from 'yaml';
import Ajv from 'ajv';
import { Deployment } from 'kubernetes-models/apps/v1/Deployment';
import { Service } from 'kubernetes-models/v1/Service';
import { ConfigMap } from 'kubernetes-models/v1/ConfigMap';
import { ServiceAccount } from 'kubernetes-models/v1/ServiceAccount';
import { Role } from 'kubernetes-models/rbac.authorization.k8s.io/v1/Role';
import { RoleBinding } from 'kubernetes-models/rbac.authorization.k8s.io/v1/RoleBinding';
import { NetworkPolicy } from 'kubernetes-models/networking.k8s.io/v1/NetworkPolicy';
import { HTTPRoute } from '@kubernetes-models/gateway-api/gateway.networking.k8s.io/v1/HTTPRoute';
import { BIN, FIXTURES } from './harness.mjs';

const DIR = fileURLToPath(new URL('../../deploy/kubernetes/', import.meta.url));

// InferencePool: the CRD's schema; its two CEL rules checked by hand
const ajv = new Ajv({ strict: false, allErrors: true, validateFormats: false });
const poolSchema = ajv.compile(JSON.parse(readFileSync(`${FIXTURES}/kubernetes/inferencepool-v1.schema.json`, 'utf8')));
function validatePool(obj) {
  if (!poolSchema(obj)) throw new Error(ajv.errorsText(poolSchema.errors, { dataVar: 'InferencePool' }));
  const ref = obj.spec.endpointPickerRef;
  if ((ref.kind ?? 'Service') === 'Service' && !ref.port) throw new Error('endpointPickerRef: port is required for a Service');
  const ports = obj.spec.targetPorts.map((p) => p.number);
  if (new Set(ports).size !== ports.length) throw new Error('targetPorts: port number must be unique');
}

const KINDS = {
  'apps/v1 Deployment': (o) => new Deployment(o).validate(),
  'v1 Service': (o) => new Service(o).validate(),
  'v1 ConfigMap': (o) => new ConfigMap(o).validate(),
  'v1 ServiceAccount': (o) => new ServiceAccount(o).validate(),
  'rbac.authorization.k8s.io/v1 Role': (o) => new Role(o).validate(),
  'rbac.authorization.k8s.io/v1 RoleBinding': (o) => new RoleBinding(o).validate(),
  'networking.k8s.io/v1 NetworkPolicy': (o) => new NetworkPolicy(o).validate(),
  'gateway.networking.k8s.io/v1 HTTPRoute': (o) => new HTTPRoute(o).validate(),
  'inference.networking.k8s.io/v1 InferencePool': validatePool,
};

export function loadManifests(dir = DIR) {
  const objects = [];
  for (const file of readdirSync(dir).filter((f) => f.endsWith('.yaml')).sort())
    for (const doc of YAML.parseAllDocuments(readFileSync(`${dir}/${file}`, 'utf8'))) {
      assert.deepEqual(doc.errors, [], `${file}: YAML`);
      objects.push({ file, obj: doc.toJS() });
    }
  return objects;
}

const objects = loadManifests();
const find = (kind, name) => {
  const o = objects.find(({ obj }) => obj.kind === kind && obj.metadata.name === name);
  assert.ok(o, `${kind} ${name} is in deploy/kubernetes/`);
  return o.obj;
};

test('every object passes its schema', () => {
  assert.ok(objects.length >= 9, `${objects.length} objects`);
  for (const { file, obj } of objects) {
    const key = `${obj.apiVersion} ${obj.kind}`;
    assert.ok(KINDS[key], `${file}: ${key} has a schema here`);
    assert.doesNotThrow(() => KINDS[key](obj), (e) => `${file}: ${key} ${obj.metadata?.name}: ${e.message}`);
  }
});

test('a misspelt field or a wrong type fails the check', () => {
  const pool = structuredClone(find('InferencePool', 'vlmd-pool'));
  pool.spec.targetPorts = [{ numbr: 8000 }];
  assert.throws(() => validatePool(pool), /number/);
  const dep = structuredClone(find('Deployment', 'vlmd'));
  dep.spec.template.spec.containers[0].ports[0].containerPort = 'eight thousand';
  assert.throws(() => new Deployment(dep).validate());
  const route = structuredClone(find('HTTPRoute', 'vlmd'));
  route.spec.rules[0].timeouts.request = '600 seconds';
  assert.throws(() => new HTTPRoute(route).validate(), /timeouts\/request/);
  // kubernetes-models, like the API server without strict field validation,
  // does not refuse unknown fields: a misspelt optional field passes
});

test('the pool, its picker, the route and vlmd\'s pods refer to each other', () => {
  const vlmd = find('Deployment', 'vlmd');
  const pool = find('InferencePool', 'vlmd-pool');
  const podLabels = vlmd.spec.template.metadata.labels;
  for (const [k, v] of Object.entries(pool.spec.selector.matchLabels))
    assert.equal(podLabels[k], v, `the pool selects vlmd's pods (${k})`);
  const container = vlmd.spec.template.spec.containers[0];
  const http = container.ports.find((p) => p.name === 'http').containerPort;
  assert.deepEqual(pool.spec.targetPorts, [{ number: http }], 'the pool targets the API port');
  const port = (flag) => container.command[container.command.indexOf(flag) + 1];
  assert.equal(Number(port('--port')), http);
  assert.equal(port('--host'), '0.0.0.0');
  for (const probe of ['startupProbe', 'readinessProbe', 'livenessProbe'])
    assert.equal(container[probe].httpGet.path, '/health', probe);
  assert.ok(Number(container.resources.limits['nvidia.com/gpu']) >= 1, 'a GPU');
  assert.ok(container.volumeMounts.some((m) => m.mountPath === '/models' && m.readOnly), 'the model from a volume');
  assert.ok(container.command.includes('/models/Qwen2.5-VL-7B-Instruct'));
  // the KV events stay off the Service (they carry prompts' token ids)
  const svc = find('Service', 'vlmd');
  assert.deepEqual(svc.spec.ports.map((p) => p.targetPort), ['http']);
  // and only the picker reaches them
  const kv = container.ports.find((p) => p.name === 'kv-events').containerPort;
  const policy = find('NetworkPolicy', 'vlmd');
  assert.deepEqual(policy.spec.podSelector.matchLabels, pool.spec.selector.matchLabels);
  const open = policy.spec.ingress.filter((r) => !r.from).flatMap((r) => r.ports.map((p) => p.port));
  assert.deepEqual(open, [http], 'only the API port is open to all');
  const kvRule = policy.spec.ingress.find((r) => r.ports.some((p) => p.port === kv));
  const eppLabels = find('Deployment', 'vlmd-epp').spec.template.metadata.labels;
  assert.deepEqual(kvRule.from.map((f) => Object.entries(f.podSelector.matchLabels).every(([k, v]) => eppLabels[k] === v)), [true]);

  const eppSvc = find('Service', pool.spec.endpointPickerRef.name);
  assert.equal(eppSvc.spec.ports[0].port, pool.spec.endpointPickerRef.port.number);
  const epp = find('Deployment', 'vlmd-epp');
  for (const [k, v] of Object.entries(eppSvc.spec.selector))
    assert.equal(epp.spec.template.metadata.labels[k], v, 'the picker\'s Service selects it');
  const args = epp.spec.template.spec.containers[0].args;
  assert.equal(args[args.indexOf('--pool-name') + 1], pool.metadata.name);
  const binding = find('RoleBinding', 'vlmd-epp');
  assert.equal(binding.subjects[0].name, epp.spec.template.spec.serviceAccountName);

  const route = find('HTTPRoute', 'vlmd');
  assert.deepEqual(route.spec.rules[0].backendRefs.map((b) => [b.kind, b.name]), [['InferencePool', pool.metadata.name]]);
});

test('the picker\'s plugin configuration: each profile uses plugins it declares', () => {
  const cm = find('ConfigMap', 'vlmd-epp');
  const epp = find('Deployment', 'vlmd-epp');
  const args = epp.spec.template.spec.containers[0].args;
  const file = args[args.indexOf('--config-file') + 1];
  const mount = epp.spec.template.spec.containers[0].volumeMounts.find((m) => file.startsWith(`${m.mountPath}/`));
  assert.ok(mount, 'the config file is on a mounted volume');
  const cfg = YAML.parse(cm.data[file.slice(mount.mountPath.length + 1)]);
  assert.equal(cfg.apiVersion, 'inference.networking.x-k8s.io/v1alpha1');
  assert.equal(cfg.kind, 'EndpointPickerConfig');
  const names = new Set(cfg.plugins.map((p) => p.name ?? p.type));
  assert.ok(cfg.schedulingProfiles.length >= 1);
  for (const profile of cfg.schedulingProfiles)
    for (const p of profile.plugins) assert.ok(names.has(p.pluginRef), `${profile.name}: ${p.pluginRef} is declared`);
  // what vlmd does not have is not asked for
  for (const p of cfg.plugins) assert.doesNotMatch(p.type, /lora|prefill|pd-|decode-filter/, p.type);
});

test('vlmd\'s command line uses only flags vlmd has', () => {
  const help = execFileSync(`${BIN}/vlmd`, ['serve', '--help'], { encoding: 'utf8' });
  const known = new Set([...help.matchAll(/^\s+(--[a-z0-9-]+)/gm)].map((m) => m[1]));
  const vlmd = find('Deployment', 'vlmd');
  const [cmd, sub, ...args] = vlmd.spec.template.spec.containers[0].command;
  assert.deepEqual([cmd, sub], ['vlmd', 'serve']);
  const flags = args.filter((a) => a.startsWith('--'));
  assert.ok(flags.length >= 5);
  for (const f of flags) assert.ok(known.has(f), `${f} is a vlmd serve flag`);
});
