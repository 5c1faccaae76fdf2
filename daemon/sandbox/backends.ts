/**
 * The drivers of this dsecd, by tier: the one place the lifecycle looks a driver up and
 * asks what it can do. Services decide by {@link BackendCapabilities}, never by a
 * backend's name.
 */
import { unimplemented } from '../errors.js';
import type { Backend } from '../model/backend.js';
import type { BackendCapabilities, SandboxDriver } from '../drivers/types.js';

/** The drivers by tier (the container driver serves `container` and `fncall`). */
export class Backends {
  constructor(private readonly drivers: ReadonlyMap<Backend, SandboxDriver>) {}

  /**
   * The driver of `backend`.
   * @throws DsecError Unimplemented when this dsecd has none for it.
   */
  driver(backend: Backend): SandboxDriver {
    const drv = this.drivers.get(backend);
    if (!drv) throw unimplemented(`backend ${backend} is not implemented yet; use backend "container"`);
    return drv;
  }

  /** The driver of `backend`, or undefined (a row of a backend this dsecd does not have). */
  find(backend: Backend): SandboxDriver | undefined {
    return this.drivers.get(backend);
  }

  /**
   * What `backend` can do on this host.
   * @throws DsecError Unimplemented when this dsecd has no driver for it.
   */
  caps(backend: Backend): BackendCapabilities {
    return this.driver(backend).capabilities(backend);
  }

  /** Every driver once (one driver may serve several tiers). */
  all(): SandboxDriver[] {
    return [...new Set(this.drivers.values())];
  }
}
