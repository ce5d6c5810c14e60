"""Example extraction schemas, used by examples/ and the benchmarks."""

from typing import Literal

from pydantic import BaseModel


class LineItem(BaseModel):
    """One billed line of an invoice."""

    description: str
    quantity: int
    unit_price: float


class Invoice(BaseModel):
    """An invoice as sent by a vendor, with its line items."""

    invoice_number: str
    vendor: str
    date: str
    currency: Literal["USD", "EUR", "GBP"]
    items: list[LineItem]
    total: float


class Contact(BaseModel):
    """A person's details from an email signature or business card."""

    name: str
    title: str
    company: str
    city: str
    phone: str
    email: str


class JobPosting(BaseModel):
    """A job advertisement."""

    title: str
    company: str
    location: str
    employment_type: Literal["full-time", "part-time", "contract", "internship"]
    remote: bool
    salary_min: int
    salary_max: int


class Event(BaseModel):
    """A public event announcement."""

    name: str
    event_type: Literal["conference", "concert", "workshop", "meetup", "festival"]
    date: str
    venue: str
    city: str
    ticket_price: float


class ProductReview(BaseModel):
    """A customer review of a product."""

    product: str
    reviewer: str
    rating: int
    sentiment: Literal["positive", "negative", "mixed"]
    would_recommend: bool


class Shipment(BaseModel):
    """A parcel shipping notification."""

    carrier: Literal["UPS", "FedEx", "DHL", "USPS"]
    tracking_number: str
    status: Literal["in_transit", "out_for_delivery", "delivered", "delayed"]
    destination_city: str
    estimated_delivery: str
    weight_kg: float


SCHEMAS = {
    "invoice": Invoice,
    "contact": Contact,
    "jobposting": JobPosting,
    "event": Event,
    "productreview": ProductReview,
    "shipment": Shipment,
}
