/**
 * dsec-gateway: the fleet's stateless front (docs/ARCHITECTURE.md "The fleet"). Any
 * number of replicas, each watching etcd into its own host table; clients use it as they
 * would one dsecd (same /v1 API, same tokens), and it places, routes and fans out.
 *
 *   dsec-gateway --listen ADDR:PORT --tls-cert F --tls-key F --tls-ca F --etcd URL[,URL...] [...]
 *   dsec-gateway token create --tenant T --role R [--ttl-s N] | token ls | token revoke ID
 *
 * Start-up: config -> etcd client -> token store and host table read from etcd (retried
 * until etcd answers) -> TLS listener. SIGTERM/SIGINT stop listening and exit.
 */
import { KeyedCreates } from './idempotency.js';
import { FleetQuotas } from './quotas.js';
import { Command } from 'commander';
import { X509Certificate } from 'node:crypto';
import https from 'node:https';
import type net from 'node:net';
import pino, { type Logger } from 'pino';
import type { FastifyInstance } from 'fastify';
import { parseListen } from '../daemon/config.js';
import { DsecError } from '../daemon/errors.js';
import { openEtcd } from '../daemon/fleet/etcd.js';
import { FleetKeys } from '../daemon/fleet/layout.js';
import { EtcdTokenStore } from '../daemon/fleet/tokens.js';
import { AuditLog } from '../daemon/remote/audit.js';
import { tcpDoor } from '../daemon/remote/door.js';
import { readPem } from '../pki/certs.js';
import { TOKEN_ROLES, TokenService, type TokenRole } from '../daemon/remote/tokens.js';
import { DSEC_VERSION } from '../daemon/version.js';
import { GatewayMetrics, type GatewayContext } from './context.js';
import { loadGatewayConfig, type GatewayConfig, type GatewaySources } from './config.js';
import { DEFAULT_WEIGHTS } from './placement.js';
import type { Router } from './routing.js';
import { buildGateway } from './server.js';
import { HostTable } from './table.js';
import { Upstreams } from './upstream.js';
import { handleUpgrade } from './ws.js';

/** A running gateway, as tests and the entry point hold it. */
export interface Gateway {
  app: FastifyInstance;
  router: Router;
  table: HostTable;
  /** Where it listens. */
  address: { host: string; port: number };
  close(): Promise<void>;
}

/** The CN of a PEM certificate. */
function commonName(pem: string): string {
  const m = /CN=([^\n,]+)/.exec(new X509Certificate(pem).subject);
  return m ? m[1].trim() : 'gateway';
}

/**
 * Starts a gateway: reads etcd (waits until it answers), then listens.
 * @throws DsecError InvalidArgument for unreadable TLS files, FailedPrecondition when the address is taken.
 */
export async function startGateway(cfg: GatewayConfig, log: Logger): Promise<Gateway> {
  const cert = readPem(cfg.tlsCert, 'CERTIFICATE', '--tls-cert');
  const key = readPem(cfg.tlsKey, 'PRIVATE KEY', '--tls-key');
  const ca = readPem(cfg.tlsCa, 'CERTIFICATE', '--tls-ca');
  const clientCa = cfg.clientCa ? readPem(cfg.clientCa, 'CERTIFICATE', '--client-ca') : null;
  const name = cfg.name ?? commonName(cert);
  const etcd = openEtcd(cfg.etcd);
  const keys = new FleetKeys(cfg.etcd.prefix);
  const store = new EtcdTokenStore(etcd, keys, log.child({ component: 'tokens' }), true);
  const table = new HostTable(etcd, keys, log.child({ component: 'hosts' }));
  try {
    await Promise.all([store.start(), table.start()]);
  } catch (e) {
    etcd.close();
    throw e;
  }
  const tokens = new TokenService(store);
  const metrics = new GatewayMetrics(table);
  const upstreams = new Upstreams({ ca, cert, key }, log.child({ component: 'upstream' }));
  const keyed = new KeyedCreates(etcd, keys, upstreams, log.child({ component: 'creates' }), () => table.fresh);
  const quotas = new FleetQuotas(etcd, keys, cfg.quotas, table, upstreams, log.child({ component: 'quotas' }));
  const ctx: GatewayContext = {
    table, upstreams, tokens, metrics, etcd, keys, log, name, keyed, quotas,
    policy: { k: cfg.placement.k, job: cfg.placement.job, weights: DEFAULT_WEIGHTS, random: Math.random, burstThreshold: cfg.placement.burstThreshold },
  };
  const audit = cfg.audit ? new AuditLog(cfg.audit) : null;
  const door = tcpDoor({
    tokens, tls: { cert, key, clientCa, peerRoles: ['client'] }, limits: cfg.limits, metrics, log: log.child({ component: 'door' }), audit,
  });
  const { app, router } = buildGateway(ctx, door);
  await app.ready();
  const server = app.server as https.Server;
  server.on('upgrade', (req, socket, head) => {
    void handleUpgrade({ ctx, router, connections: door.connections, clientRoles: clientCa ? ['client'] : null }, req, socket, head);
  });
  const { host, port } = parseListen(cfg.listen, '--listen');
  try {
    await app.listen({ host, port });
  } catch (e) {
    await app.close().catch(() => {});
    await Promise.all([store.close(), table.close()]);
    etcd.close();
    throw new DsecError('FailedPrecondition', `cannot listen on ${cfg.listen}: ${(e as Error).message}`, { cause: e });
  }
  quotas.start();
  const a = server.address() as net.AddressInfo;
  log.info({ address: `${a.address}:${a.port}`, gateway: name, hosts: table.hosts.size, etcd: cfg.etcd.endpoints }, 'dsec-gateway ready');
  return {
    app, router, table, address: { host: a.address, port: a.port },
    async close() {
      const t = setTimeout(() => server.closeAllConnections(), 10_000);
      await app.close();
      clearTimeout(t);
      await keyed.close();
      await quotas.close();
      upstreams.close();
      tokens.close();
      await Promise.all([store.close(), table.close()]);
      etcd.close();
    },
  };
}

/** `dsec-gateway token ...`: manages the fleet's tokens in etcd directly (bootstrap: the first admin token). */
async function tokenCommand(cfg: GatewayConfig, argv: { verb: string; tenant?: string; role?: string; ttlS?: number; description?: string; id?: string; json?: boolean }, log: Logger): Promise<number> {
  const etcd = openEtcd(cfg.etcd);
  const store = new EtcdTokenStore(etcd, new FleetKeys(cfg.etcd.prefix), log, true);
  try {
    await store.start(AbortSignal.timeout(10_000));
    const tokens = new TokenService(store);
    let out: unknown;
    if (argv.verb === 'create') {
      if (!argv.tenant || !argv.role || !(TOKEN_ROLES as readonly string[]).includes(argv.role)) throw new DsecError('InvalidArgument', `token create needs --tenant NAME and --role ${TOKEN_ROLES.join('|')}`);
      const r = await tokens.create({ tenant: argv.tenant, role: argv.role as TokenRole, ttlMs: argv.ttlS ? argv.ttlS * 1000 : null, description: argv.description ?? null });
      out = argv.json ? { ...r.view, token: r.token } : `${r.token}\n`;
    } else if (argv.verb === 'ls') {
      const list = await tokens.list();
      out = argv.json ? { tokens: list } : list.map((t) => `${t.id}  ${t.tenant}  ${t.role}  ${t.state}${t.description ? `  ${t.description}` : ''}`).join('\n') + (list.length ? '\n' : '');
    } else {
      const v = await tokens.revoke(argv.id ?? '');
      out = argv.json ? v : `${v.id} revoked\n`;
    }
    process.stdout.write(typeof out === 'string' ? out : `${JSON.stringify(out, null, 2)}\n`);
    tokens.close();
    return 0;
  } finally {
    await store.close();
    etcd.close();
  }
}

/** Entry point of bin/dsec-gateway. Returns the process exit code. */
export async function main(argv: string[]): Promise<number> {
  const common = (c: Command) => c
    .option('--config <file>', 'TOML config file (default /etc/dsec/gateway.toml, optional)')
    .option('--tls-cert <file>', 'the gateway\'s certificate (role gateway), PEM')
    .option('--tls-key <file>', 'its key, PEM')
    .option('--tls-ca <file>', 'the fleet CA, PEM: hosts\' certificates must chain to it')
    .option('--etcd <urls>', 'the fleet\'s etcd client URLs, comma-separated')
    .option('--etcd-cert <file>', 'etcd client certificate (default --tls-cert; its CN is the gateway\'s etcd user)')
    .option('--etcd-key <file>', 'its key (default --tls-key)')
    .option('--etcd-ca <file>', 'CA of etcd\'s server certificate (default --tls-ca)')
    .option('--etcd-prefix <path>', 'key prefix of the fleet (default /dsec)');
  let action: (() => Promise<number>) | null = null;
  let code = 0;
  const logOf = (cfg: GatewayConfig) => pino({ level: cfg.logLevel, base: { gateway: cfg.name ?? undefined } }, pino.destination({ dest: 2, sync: false }));
  const load = (o: GatewaySources): GatewayConfig => loadGatewayConfig(o);
  const program = common(new Command('dsec-gateway'))
    .description('dsec fleet gateway: serves the dsec API for every host of a fleet (placement, routing, fan-out)')
    .option('--listen <addr:port>', 'serve the API over TLS 1.3 here (default 0.0.0.0:8443)')
    .option('--client-ca <file>', 'also require client certificates of this CA (role client)')
    .option('--name <name>', 'the gateway\'s name (default its certificate\'s CN)')
    .option('--audit <file>', 'append an audit log of every mutating call (JSON lines)')
    .option('--placement-k <n>', 'hosts sampled per placement (best of K; default 3)', (v) => Number(v))
    .option('--job-placement <mode>', 'spread (default) or pack the sandboxes of a job')
    .option('--burst-threshold <fraction>', 'primary-pool utilisation (0..1) above which pool=burst hosts take creates that allow them (default 0.8)', (v) => Number(v))
    .version(DSEC_VERSION)
    .exitOverride()
    .action((o: GatewaySources) => {
      action = async () => {
        const cfg = load(o);
        const log = logOf(cfg);
        const gw = await startGateway(cfg, log);
        await new Promise<void>((resolve) => {
          process.once('SIGTERM', () => resolve());
          process.once('SIGINT', () => resolve());
        });
        log.info('shutting down');
        await gw.close();
        log.flush();
        return 0;
      };
    });
  const token = program.command('token').description('the fleet\'s API tokens, in etcd (runs locally with the gateway\'s etcd credentials)');
  for (const verb of ['create', 'ls', 'revoke']) {
    const c = common(token.command(verb === 'revoke' ? 'revoke <id>' : verb)).option('--json', 'print JSON');
    if (verb === 'create') {
      c.requiredOption('--tenant <name>', 'the tenant the token acts for').requiredOption('--role <role>', TOKEN_ROLES.join('|'))
        .option('--ttl-s <n>', 'lifetime in seconds (default: never expires)', (v) => Number(v)).option('--description <text>', 'free text');
    }
    c.exitOverride().action((...args: unknown[]) => {
      // Flags the program also defines (--tls-cert, --etcd, ...) may be parsed by either: take both.
      const o = (args[args.length - 1] as Command).optsWithGlobals() as GatewaySources & { tenant?: string; role?: string; ttlS?: number; description?: string; json?: boolean };
      action = async () => {
        const cfg = load(o);
        return tokenCommand(cfg, { verb, ...o, id: verb === 'revoke' ? String(args[0]) : undefined }, pino({ level: 'warn' }, pino.destination(2)));
      };
    });
  }
  try {
    program.parse(argv);
  } catch (e) {
    const c = (e as { exitCode?: number }).exitCode ?? 2;
    return c === 0 ? 0 : 2;
  }
  if (!action) return 2;
  try {
    code = await (action as () => Promise<number>)();
  } catch (e) {
    process.stderr.write(`dsec-gateway: ${e instanceof DsecError ? e.message : (e as Error).stack}\n`);
    return e instanceof DsecError && e.kind === 'InvalidArgument' ? 2 : 1;
  }
  return code;
}
