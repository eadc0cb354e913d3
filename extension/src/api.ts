/**
 * The server extension's panel API (`{baseUrl}kernelfleet/api/...`), typed.
 *
 * Every call goes to this Jupyter server, which calls the gateway with its own token: the browser
 * never holds the gateway token. Errors arrive as `PanelApiError` carrying the server's
 * `{reason, message}`: `not-found` (not this server's kernel, or not a kernelfleet kernel),
 * `not-kernelfleet` (the server is not in gateway mode), `gateway-unreachable` (502, the message
 * names the gateway's URL).
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

export interface IReplica {
  id: string;
  host: string;
  pid: number;
  state: string;
}

export interface IGpusHeld {
  host: string;
  devices: string[];
}

export interface IRecentCell {
  id: string;
  host: string | null;
  gpus: number;
  devices: string[];
  queued_at: number | null;
  started_at: number | null;
  start_delay_s: number | null;
  waited: string | null;
  moved_to: string | null;
  outcome: string | null;
  duration_s: number | null;
}

/** `GET /api/fleet/kernels/{id}`; the fields after `executor` may be absent on older gateways. */
export interface IKernelModel {
  id: string;
  name: string;
  replicas: IReplica[];
  executor: string | null;
  gpus?: number;
  gpus_held?: IGpusHeld[];
  queued_cells?: number;
  recent_cells?: IRecentCell[];
  /** Why its next cell waits for GPUs now; null when none waits. */
  waiting?: IWaitingModel | null;
  /** Why it runs on fewer live replicas than it wants; null while it has them all. */
  degraded?: IDegradedModel | null;
}

export interface IDegradedModel {
  since: number;
  reason: string;
  live_replicas: number;
  wanted_replicas: number;
}

export interface IWaitingModel {
  cell_id: string;
  gpus: number;
  reason: string;
  cells_ahead: number;
  text: string;
}

export interface IHostModel {
  id: string;
  state: string;
  gpus: {
    total: number;
    subscribed: number;
    committed: number;
    over_committed?: boolean;
    /** The host's device ids, in its order (absent on older gateways). */
    devices?: (string | { id: string; lent_to_job?: string | null })[];
    /** Device -> what the cell bound to it is. */
    committed_devices?: { [device: string]: unknown };
    /** Device -> the background job it is lent to, or null. */
    lent_to_job?: { [device: string]: string | null };
  };
}

/** The GPUs a running job holds. */
export interface IJobLease {
  host: string;
  gpu_type: string;
  devices: string[];
}

/** A background job, as `GET /api/fleet/jobs` lists it. */
export interface IJob {
  id: string;
  name: string;
  owner_kernel: string | null;
  state: string;
  gpus: number;
  steps: number;
  steps_done: number;
  weight: number;
  throughput: { [gpuType: string]: number };
  lease: IJobLease | null;
  preemptions: number;
  lost_steps: number;
  restarts: number;
  exit_code: number | null;
  error: string | null;
  log_tail: string[];
}

/** `GET /api/fleet/jobs`: the job policy and every job, newest last. */
export interface IJobsModel {
  policy: string;
  jobs: IJob[];
}

export interface IFleetSummary {
  version: string;
  policy: string;
  replicas: number;
  hosts: { alive: number; lost: number };
  gpus: { total: number; subscribed: number; committed: number };
  kernels: number;
  /** The background jobs (absent on gateways without them). */
  jobs?: { queued: number; running: number; gpus_lent: number };
  autoscaling: {
    min_hosts: number;
    max_hosts: number;
    last_round: { decision: string } | null;
  } | null;
}

export interface IFleetModel {
  fleet: IFleetSummary;
  hosts: IHostModel[];
  /** Null from a gateway without background jobs. */
  jobs?: IJobsModel | null;
}

/** One section of another tool, rendered generically. */
export interface ISection {
  name: string;
  title: string;
  rows: { label: string; value: string }[];
  text: string | null;
  error: string | null;
}

/** A fleet event as the gateway publishes it. */
export interface IFleetEvent {
  seq: number;
  time: number;
  type: string;
  kernel_id: string | null;
  host_id: string | null;
  data: { [key: string]: any };
}

export class PanelApiError extends Error {
  constructor(
    readonly status: number,
    readonly reason: string,
    message: string
  ) {
    super(message);
  }
}

const API = 'kernelfleet/api';

/** `GET {baseUrl}kernelfleet/api/{path}` as JSON; `PanelApiError` for any error answer. */
export async function getJson<T>(
  path: string,
  query: Record<string, string> = {}
): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const params = new URLSearchParams(query).toString();
  const url = URLExt.join(settings.baseUrl, API, path) + (params ? `?${params}` : '');
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, {}, settings);
  } catch (error) {
    throw new PanelApiError(0, 'server-unreachable', `the Jupyter server did not answer: ${error}`);
  }
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    throw new PanelApiError(
      response.status,
      body.reason ?? 'http-error',
      body.message ?? `${response.status} ${response.statusText}`
    );
  }
  return body as T;
}

/** The websocket URL of the proxied event stream, starting after event `since`. */
export function eventsUrl(since: number | null): string {
  const settings = ServerConnection.makeSettings();
  const query = new URLSearchParams();
  if (since !== null) {
    query.set('since', String(since));
  }
  if (settings.token) {
    query.set('token', settings.token);
  }
  const params = query.toString();
  return URLExt.join(settings.wsUrl, API, 'events') + (params ? `?${params}` : '');
}
