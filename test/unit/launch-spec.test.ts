// What to run, derived from what real peers send to Create (SPEC.md section 2): CRI's
// runtime.v1.PodSandboxConfig (protobuf) in `options`, CRI's sandbox metadata (JSON) in
// `sandbox.extensions["metadata"]`, a non-CRI client's OCI runtime spec (JSON) in
// `sandbox.spec`; type URLs with or without the type.googleapis.com/ prefix; unknown types
// ignored, malformed known ones refused.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { BinaryWriter, WireType } from '@bufbuild/protobuf/wire';
import { deriveLaunchSpec, isType, type CreateInput } from '../../src/controller/launch-spec.js';
import type { AnyValue } from '../../src/controller/types.js';
import { isTsboxError } from '../../src/base/errors.js';

const NS = 'k8s.io';
const ID = '5f1c2b3a4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8';
const DEFAULT_PATH = 'PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';
const POD_CONFIG_URL = 'runtime.v1.PodSandboxConfig';
const METADATA_URL = 'github.com/containerd/cri/pkg/store/sandbox/Metadata';
const OCI_URL = 'types.containerd.io/opencontainers/runtime-spec/1/Spec';
const GOOGLE = 'type.googleapis.com/';

interface PodConfig {
  readonly name: string;
  readonly uid: string;
  readonly namespace: string;
  readonly attempt: number;
  readonly hostname?: string;
  readonly labels?: Readonly<Record<string, string>>;
}

/** Encodes a runtime.v1.PodSandboxConfig as CRI sends it (Kubernetes CRI api.proto). */
function encodePodSandboxConfig(config: PodConfig): Uint8Array {
  const writer = new BinaryWriter();
  // 1: metadata PodSandboxMetadata {1 name, 2 uid, 3 namespace, 4 attempt}
  writer
    .tag(1, WireType.LengthDelimited)
    .fork()
    .tag(1, WireType.LengthDelimited)
    .string(config.name)
    .tag(2, WireType.LengthDelimited)
    .string(config.uid)
    .tag(3, WireType.LengthDelimited)
    .string(config.namespace)
    .tag(4, WireType.Varint)
    .uint32(config.attempt)
    .join();
  // 2: hostname
  if (config.hostname !== undefined) writer.tag(2, WireType.LengthDelimited).string(config.hostname);
  // 3: log_directory
  writer.tag(3, WireType.LengthDelimited).string(`/var/log/pods/${config.namespace}_${config.name}_${config.uid}`);
  // 6: labels map<string,string>, one entry message {1 key, 2 value} per label
  for (const [key, value] of Object.entries(config.labels ?? {})) {
    writer.tag(6, WireType.LengthDelimited).fork().tag(1, WireType.LengthDelimited).string(key).tag(2, WireType.LengthDelimited).string(value).join();
  }
  // 8: linux LinuxPodSandboxConfig {1 cgroup_parent}
  writer.tag(8, WireType.LengthDelimited).fork().tag(1, WireType.LengthDelimited).string('/kubepods/besteffort').join();
  return writer.finish();
}

const POD: PodConfig = {
  name: 'web-0',
  uid: 'b3c1e0a2-1111-2222-3333-444455556666',
  namespace: 'default',
  attempt: 1,
  hostname: 'web-0',
  labels: { app: 'web', 'io.kubernetes.pod.name': 'web-0' },
};

/** CRI's sandbox metadata as containerd stores it (versioned JSON). */
function criMetadata(hostname: string | undefined): Uint8Array {
  return Buffer.from(
    JSON.stringify({
      Version: 'v1',
      Metadata: {
        ID: ID,
        Name: 'web-0_default_b3c1e0a2_1',
        Config: {
          metadata: { name: 'web-0', uid: POD.uid, namespace: 'default', attempt: 1 },
          ...(hostname === undefined ? {} : { hostname }),
          labels: { app: 'web' },
          linux: { security_context: { namespace_options: { network: 2 } } },
        },
        NetNSPath: '',
        IP: '',
        RuntimeHandler: 'tsbox',
        CNIResult: null,
        ProcessLabel: '',
      },
    }),
  );
}

const ociSpec = (spec: unknown): AnyValue => ({ typeUrl: OCI_URL, value: Buffer.from(JSON.stringify(spec)) });

function input(fields: Partial<CreateInput> = {}): CreateInput {
  return { netnsPath: '', options: undefined, spec: undefined, extensions: {}, ...fields };
}

const invalidArgument = (err: unknown): boolean => {
  assert.ok(isTsboxError(err, 'InvalidArgument'), `expected InvalidArgument, got ${String(err)}`);
  return true;
};

describe('deriveLaunchSpec', () => {
  test('an empty request runs a pause process on the host network', () => {
    assert.deepEqual(deriveLaunchSpec(NS, ID, input()), { namespace: NS, id: ID });
  });

  test('the network namespace path is kept; an empty one means the host network', () => {
    assert.equal(deriveLaunchSpec(NS, ID, input({ netnsPath: '/var/run/netns/cni-1234' })).netnsPath, '/var/run/netns/cni-1234');
    assert.equal('netnsPath' in deriveLaunchSpec(NS, ID, input({ netnsPath: '' })), false);
  });

  test('hostname from CRI\'s PodSandboxConfig, type URL without prefix', () => {
    const options = { typeUrl: POD_CONFIG_URL, value: encodePodSandboxConfig(POD) };
    assert.equal(deriveLaunchSpec(NS, ID, input({ options })).hostname, 'web-0');
  });

  test('hostname from CRI\'s PodSandboxConfig, type URL with the type.googleapis.com/ prefix', () => {
    const options = { typeUrl: GOOGLE + POD_CONFIG_URL, value: encodePodSandboxConfig({ ...POD, hostname: 'db-1' }) };
    assert.equal(deriveLaunchSpec(NS, ID, input({ options })).hostname, 'db-1');
  });

  test('the pod uid inside metadata (also field 2, one level down) is not mistaken for the hostname', () => {
    const { hostname: _none, ...noHostname } = POD;
    const bytes = encodePodSandboxConfig(noHostname);
    assert.equal(deriveLaunchSpec(NS, ID, input({ options: { typeUrl: POD_CONFIG_URL, value: bytes } })).hostname, undefined);
  });

  test('hostname from CRI\'s metadata extension when options has none, with or without prefix', () => {
    for (const typeUrl of [METADATA_URL, GOOGLE + METADATA_URL]) {
      const extensions = { metadata: { typeUrl, value: criMetadata('web-0') } };
      assert.equal(deriveLaunchSpec(NS, ID, input({ extensions })).hostname, 'web-0', typeUrl);
    }
  });

  test('the PodSandboxConfig hostname wins over the metadata extension', () => {
    const options = { typeUrl: POD_CONFIG_URL, value: encodePodSandboxConfig({ ...POD, hostname: 'from-options' }) };
    const extensions = { metadata: { typeUrl: METADATA_URL, value: criMetadata('from-metadata') } };
    assert.equal(deriveLaunchSpec(NS, ID, input({ options, extensions })).hostname, 'from-options');
  });

  test('a metadata extension without a hostname gives none', () => {
    const extensions = { metadata: { typeUrl: METADATA_URL, value: criMetadata(undefined) } };
    assert.equal(deriveLaunchSpec(NS, ID, input({ extensions })).hostname, undefined);
  });

  test('the OCI spec\'s process becomes the command; PATH is added when missing', () => {
    const spec = ociSpec({
      ociVersion: '1.1.0',
      process: { args: ['/bin/sleep', 'infinity'], env: ['TERM=xterm', 'HOME=/root'], cwd: '/work', user: { uid: 0, gid: 0 } },
      root: { path: 'rootfs' },
      hostname: 'oci-host',
    });
    const derived = deriveLaunchSpec(NS, ID, input({ spec }));
    assert.deepEqual(derived.command, {
      args: ['/bin/sleep', 'infinity'],
      env: [DEFAULT_PATH, 'TERM=xterm', 'HOME=/root'],
      cwd: '/work',
    });
    assert.equal(derived.hostname, 'oci-host');
  });

  test('a PATH in the OCI env is kept as given; cwd defaults to /', () => {
    const env = ['PATH=/opt/bin', 'A=1'];
    const derived = deriveLaunchSpec(NS, ID, input({ spec: { typeUrl: GOOGLE + OCI_URL, value: Buffer.from(JSON.stringify({ process: { args: ['run'], env } })) } }));
    assert.deepEqual(derived.command, { args: ['run'], env, cwd: '/' });
  });

  test('an OCI process without env gets only the default PATH', () => {
    const derived = deriveLaunchSpec(NS, ID, input({ spec: ociSpec({ process: { args: ['x'] } }) }));
    assert.deepEqual(derived.command?.env, [DEFAULT_PATH]);
  });

  test('an OCI spec with no args (or no process) runs the pause process', () => {
    assert.equal(deriveLaunchSpec(NS, ID, input({ spec: ociSpec({ process: { args: [], cwd: '/' } }) })).command, undefined);
    assert.equal(deriveLaunchSpec(NS, ID, input({ spec: ociSpec({ ociVersion: '1.1.0' }) })).command, undefined);
  });

  test('CRI hostname wins over the OCI spec\'s', () => {
    const options = { typeUrl: POD_CONFIG_URL, value: encodePodSandboxConfig(POD) };
    const derived = deriveLaunchSpec(NS, ID, input({ options, spec: ociSpec({ hostname: 'oci-host', process: { args: ['x'] } }) }));
    assert.equal(derived.hostname, 'web-0');
    assert.deepEqual(derived.command?.args, ['x']);
  });

  test('unknown type URLs are ignored, whatever their bytes', () => {
    const garbage = new Uint8Array([0xff, 0xfe, 0x00, 0x7b, 0x22]);
    const derived = deriveLaunchSpec(
      NS,
      ID,
      input({
        options: { typeUrl: 'example.com/some.other.Options', value: garbage },
        spec: { typeUrl: 'example.com/not/an/oci/Spec', value: garbage },
        extensions: {
          metadata: { typeUrl: 'example.com/OtherMetadata', value: garbage },
          other: { typeUrl: METADATA_URL, value: garbage },
        },
      }),
    );
    assert.deepEqual(derived, { namespace: NS, id: ID });
  });

  test('a type URL that only ends with a known name, without a separator, is not that type', () => {
    assert.equal(isType('xruntime.v1.PodSandboxConfig', POD_CONFIG_URL), false);
    assert.equal(isType('type.googleapis.com/runtime.v1.PodSandboxConfig', POD_CONFIG_URL), true);
    assert.equal(isType(POD_CONFIG_URL, POD_CONFIG_URL), true);
    const derived = deriveLaunchSpec(NS, ID, input({ options: { typeUrl: 'xruntime.v1.PodSandboxConfig', value: new Uint8Array([0xff]) } }));
    assert.equal(derived.hostname, undefined);
  });

  test('malformed OCI JSON is INVALID_ARGUMENT', () => {
    assert.throws(() => deriveLaunchSpec(NS, ID, input({ spec: { typeUrl: OCI_URL, value: Buffer.from('{"process": {"args": [') } })), invalidArgument);
  });

  test('an OCI spec of the wrong shape is INVALID_ARGUMENT', () => {
    assert.throws(() => deriveLaunchSpec(NS, ID, input({ spec: ociSpec({ process: { args: 'sh -c true' } }) })), invalidArgument);
    assert.throws(() => deriveLaunchSpec(NS, ID, input({ spec: ociSpec({ process: { env: [1, 2] } }) })), invalidArgument);
    assert.throws(() => deriveLaunchSpec(NS, ID, input({ spec: ociSpec([1, 2, 3]) })), invalidArgument);
  });

  test('malformed CRI metadata JSON is INVALID_ARGUMENT', () => {
    const extensions = { metadata: { typeUrl: METADATA_URL, value: Buffer.from('{"Version":"v1","Metadata":') } };
    assert.throws(() => deriveLaunchSpec(NS, ID, input({ extensions })), invalidArgument);
  });

  test('a truncated PodSandboxConfig is INVALID_ARGUMENT', () => {
    const bytes = encodePodSandboxConfig(POD);
    const truncated = bytes.subarray(0, bytes.length - 3);
    assert.throws(() => deriveLaunchSpec(NS, ID, input({ options: { typeUrl: POD_CONFIG_URL, value: truncated } })), invalidArgument);
  });

  test('an invalid hostname is INVALID_ARGUMENT, wherever it comes from', () => {
    for (const bad of ['web_0', '-web', 'web 0', 'a'.repeat(64), 'wéb']) {
      const options = { typeUrl: POD_CONFIG_URL, value: encodePodSandboxConfig({ ...POD, hostname: bad }) };
      assert.throws(() => deriveLaunchSpec(NS, ID, input({ options })), invalidArgument, `options hostname ${bad}`);
      assert.throws(() => deriveLaunchSpec(NS, ID, input({ spec: ociSpec({ hostname: bad }) })), invalidArgument, `OCI hostname ${bad}`);
    }
  });

  test('hostnames up to 63 characters, with dots and dashes, are accepted', () => {
    for (const good of ['a', 'a'.repeat(63), 'web-0.default.svc', 'Node1']) {
      const options = { typeUrl: POD_CONFIG_URL, value: encodePodSandboxConfig({ ...POD, hostname: good }) };
      assert.equal(deriveLaunchSpec(NS, ID, input({ options })).hostname, good);
    }
  });

  test('an empty hostname in PodSandboxConfig means none', () => {
    const options = { typeUrl: POD_CONFIG_URL, value: encodePodSandboxConfig({ ...POD, hostname: '' }) };
    assert.equal('hostname' in deriveLaunchSpec(NS, ID, input({ options })), false);
  });
});
