"""``leveret scheduler``: list, show and cancel a running broker's scheduled messages
(ActiveMQ's scheduled jobs and the delayed-message exchange's messages), through the
control socket in its data directory, as ``leveret ctl`` does."""

from __future__ import annotations

import click

from .ctl import Context, pass_ctx


@click.group()
@click.option("--data-dir", default="./leveret-data", show_default=True, help="The broker's data directory.")
@click.option("-q", "--quiet", is_flag=True, help="No informational line before listings.")
@click.pass_context
def scheduler(context: click.Context, data_dir: str, quiet: bool) -> None:
    """Scheduled and delayed messages waiting in a running broker (times in UTC, delay
    and period in ms, repeat: deliveries after the next, -1 forever)."""
    context.obj = Context(data_dir, quiet)


@scheduler.command("list")
@click.option("-p", "--vhost", default=None, help="Only this virtual host's jobs.")
@click.option(
    "--limit", type=int, default=100, show_default=True, help="Jobs to show, the soonest due first."
)
@pass_ctx
def list_jobs(ctx: Context, vhost: str | None, limit: int) -> None:
    """The jobs due soonest."""
    ctx.run("list_scheduled", "Listing scheduled jobs ...", vhost=vhost, limit=limit)


@scheduler.command("show")
@click.argument("job_id")
@pass_ctx
def show_job(ctx: Context, job_id: str) -> None:
    """One job (JOB_ID as ``list`` shows it: the message id, or ``scheduledJobId``)."""
    ctx.run("show_scheduled", f"Scheduled job {job_id} ...", job_id=job_id)


@scheduler.command("cancel")
@click.argument("job_id")
@click.option("-p", "--vhost", default=None, help="Only if the job is in this virtual host.")
@pass_ctx
def cancel_job(ctx: Context, job_id: str, vhost: str | None) -> None:
    """Remove a job: its message is not delivered (again)."""
    ctx.run("cancel_scheduled", job_id=job_id, vhost=vhost)
