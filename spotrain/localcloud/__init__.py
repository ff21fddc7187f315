"""The local cloud: an AWS emulator (moto in server mode) on loopback, with the gaps that
matter to spotrain closed (extensions.py), started and stopped by `spotrain local`."""
