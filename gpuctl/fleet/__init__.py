"""The headless admin core: fleet client, reassignment service, lease acquisition, bootstrap, the
demo fleet and the console's data sources. Never imports textual."""
